"""``python -m bench NAME [args]``: run one benchmark and write its record; ``--list`` names them all.

A benchmark is found by reading ``bench/*.py`` (a module with top-level ``add_arguments`` and ``run``),
not by importing it, so ``--list`` stays instant and a benchmark's heavy imports load only when it runs.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.record import default_path, make_record, write_record

PARTIAL_SUFFIX = ".partial"  # beside the record, while a benchmark that saves its progress runs

BENCH_DIR = Path(__file__).resolve().parent


def benchmarks(bench_dir: Path = BENCH_DIR) -> dict[str, str]:
    """``{name: first docstring line}`` of every benchmark module in ``bench_dir``, by name."""
    found = {}
    for path in sorted(bench_dir.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        if {"add_arguments", "run"} <= defined:
            found[path.stem] = (ast.get_docstring(tree) or "").strip().split("\n", 1)[0]
    return found


def _parser(name: str, module: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m bench {name}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--record", type=Path, default=None,
                       help="write the record here (default: bench/records/<name>.<device>.json)")
    where.add_argument("--no-record", action="store_true", help="print the figures, write no record")
    module.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark ``argv[0]`` with the rest of ``argv`` as its arguments; 2 on bad input."""
    argv = sys.argv[1:] if argv is None else argv
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench NAME [args...] | --list\n\nbenchmarks: " + ", ".join(known))
        return 0 if argv else 2
    if argv[0] == "--list":
        width = max(map(len, known), default=0)
        print("\n".join(f"{name:<{width}}  {claim}" for name, claim in known.items()))
        return 0
    name = argv[0]
    if name not in known:
        print(f"python -m bench: error: unknown benchmark {name!r} (one of: {', '.join(known)})", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    args = _parser(name, module).parse_args(argv[1:])
    started_at = datetime.now(timezone.utc)
    command = ["python", "-m", "bench", *argv]
    partials: set[Path] = set()

    def save_partial(figures: dict[str, Any]) -> None:
        """Keep what a long benchmark has measured so far in ``<record>.partial``: a run killed or timed
        out midway still leaves its finished parts (the complete record replaces it)."""
        if args.no_record:
            return
        record = make_record(name, known[name], command, started_at, {**figures, "complete": False})
        path = args.record or default_path(record)
        partials.add(write_record(record, path.with_name(path.name + PARTIAL_SUFFIX)))

    args.save_partial = save_partial
    try:
        figures = module.run(args)
    except ValueError as exc:
        print(f"python -m bench {name}: error: {exc}", file=sys.stderr)
        return 2
    record = make_record(name, known[name], command, started_at, figures)
    print(json.dumps(figures, indent=1))
    if not args.no_record:
        path = write_record(record, args.record or default_path(record))
        print(f"record: {path}", file=sys.stderr)
        for partial in partials:
            partial.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
