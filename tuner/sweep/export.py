"""Export per-arch tuned tables from the database, with provenance.

Per (kernel, shape) the entry is, by default, the newest re-timing winner among ``ok``
trials of that arch (a newer sweep may follow a kernel change that makes older timings
stale), else the fastest ``ok`` trial. A newer sweep can also be a smaller re-run that missed
what an older one found; :func:`regressions` names every such entry, and ``fastest`` lists the
kernels (or ``all``) whose entries take the fastest winner of any sweep instead, for kernels whose
code has not changed since the older sweep. ``wrong`` configs can never be exported: only ``ok``
rows are read.

Tables go to the user's tables folder (``kernels.tuning.user_tables_dir``), never into the
package; the run-time lookup lays them over the shipped tables entry by entry, so a user table
holds only what was tuned here (a copy of a shipped entry would hide a newer shipped one). By
default (``merge``) the entries of the table already at the output path are kept for every
(kernel, shape) the database has no trial for (a sweep database lost or kept elsewhere, a
re-sweep of some kernels only): an export replaces only its own winners' entries. The provenance says which entries were kept and from
which export. Where that table's entry is faster than the database's, the export names it, and
keeps it for the kernels in ``fastest``. The file is written to a temporary name and renamed, so
a reader never sees half a table, and nothing is written when anything is wrong.

Times compare under a rank (``tuner.sweep.ranking``): device time by default, or the eager call time.
Each entry records its host time, and :func:`host_bound_entries` names the entries whose eager
calls wait on the host.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from db import Trial, TrialStatus, session_scope
from kernels.tuning import TABLE_SCHEMA_VERSION, TableError, read_table, table_path, user_tables_dir
from tuner.sweep.ranking import DEFAULT_RANK, RANKS, Rank, common_rank, entry_time, pick, trial_time


class ExportError(ValueError):
    """An export that cannot be written as asked; the message names the option or file and why."""


class NothingToExport(ExportError):
    """The database (or the kept table) has nothing for what was asked."""


ALL = "all"
REGRESSION_TOLERANCE = 0.05  # timing noise across device sessions stays below this


def _ok_trials(engine: Engine, arch: str) -> list[Trial]:
    with session_scope(engine) as session:
        return list(session.scalars(
            select(Trial).where(Trial.arch == arch, Trial.status == TrialStatus.ok.value)
        ).all())


def _choose(rows: Sequence[Trial], fastest: Collection[str], rank: Rank) -> list[Trial]:
    """See :func:`best_trials`."""
    groups: dict[tuple[str, str], list[Trial]] = {}
    for row in rows:
        groups.setdefault((row.kernel, row.shape_key), []).append(row)
    chosen = []
    for (kernel, _), group in sorted(groups.items()):
        winners = [row for row in group if row.is_winner]
        if winners and ALL not in fastest and kernel not in fastest:
            newest = max(row.sweep_id for row in winners)
            winners = [row for row in winners if row.sweep_id == newest]
        chosen.append(pick(winners or group, trial_time, rank))
    return chosen


def best_trials(engine: Engine, arch: str, fastest: Collection[str] = (), rank: Rank = DEFAULT_RANK) -> list[Trial]:
    """The chosen trial per (kernel, shape_key) for ``arch``: winners first (of the newest sweep, or
    the fastest of any sweep for the kernels in ``fastest``, every kernel with ``all``), then the
    fastest ok trial; fastest under ``rank``."""
    return _choose(_ok_trials(engine, arch), fastest, rank)


def regressions(trials: Sequence[Trial], fastest_of_all: Sequence[Trial], rank: Rank = DEFAULT_RANK) -> list[str]:
    """One line per chosen trial slower under ``rank``, beyond timing noise, than the fastest winner of
    its (kernel, shape) over every sweep (``fastest_of_all``: the choice with ``fastest=("all",)``)."""
    best = {(t.kernel, t.shape_key): t for t in fastest_of_all}
    lines = []
    for t in trials:
        other = best[(t.kernel, t.shape_key)]
        times = (trial_time(t), trial_time(other))
        ms, other_ms = (time.ms(common_rank(rank, times)) for time in times)
        if other.id != t.id and ms > other_ms * (1 + REGRESSION_TOLERANCE):
            lines.append(f"{t.kernel} {t.shape_key}: sweep {t.sweep_id}'s winner takes {ms:.4g} ms, "
                         f"sweep {other.sweep_id}'s {other_ms:.4g} ms")
    return lines


def build_table(trials: list[Trial], arch: str, skipped: Sequence[str] = (),
                fastest: Sequence[str] = (), rank: Rank = DEFAULT_RANK) -> dict[str, Any]:
    entries: dict[str, dict[str, Any]] = {}
    for t in trials:
        entries.setdefault(t.kernel, {})[t.shape_key] = {
            "config": t.config, "median_ms": t.median_ms, "retime_ms": t.retime_ms, "host_ms": trial_time(t).host_ms,
            "gbps": t.metrics.get("gbps"), "sweep_id": t.sweep_id, "trial_id": t.id, "identity": t.identity,
        }
    return {
        "schema_version": TABLE_SCHEMA_VERSION,
        "arch": arch,
        "provenance": {
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "devices": sorted({t.gpu_name for t in trials if t.gpu_name}),
            "sm_counts": sorted({t.sm_count for t in trials if t.sm_count}),
            "hosts": sorted({t.host for t in trials if t.host}),
            "toolchains": [dict(v) for v in sorted({tuple(sorted(t.versions.items())) for t in trials},
                                                   key=str)],
            "sweep_ids": sorted({t.sweep_id for t in trials}),
            "skipped_kernels": sorted(skipped),
            "fastest_kernels": sorted(fastest),
            "rank": rank,
        },
        "entries": entries,
    }


def host_bound_entries(table: dict[str, Any]) -> list[str]:
    """One line per entry whose eager calls wait on the host: its host time a call exceeds its device
    time (entries from before host times were measured have none)."""
    lines = []
    for kernel, shapes in sorted(table["entries"].items()):
        for key, entry in sorted(shapes.items()):
            time = entry_time(entry)
            if time is not None and time.host_bound:
                lines.append(f"{kernel} {key}: host-bound, {time.host_ms:.4g} ms of host time a call against "
                             f"{time.device_ms:.4g} ms on the device")
    return lines


def _merged(table: dict[str, Any], previous: dict[str, Any], skip: Sequence[str],
            fastest: Collection[str], rank: Rank) -> tuple[dict[str, Any], list[str]]:
    """``table`` plus the ``previous`` table's entries of (kernel, shape) pairs it lacks (not of skipped
    kernels), and of pairs where the previous entry is faster, for the kernels in ``fastest``; the
    devices, hosts and toolchains joined, and the kept entries counted per kernel with the sweep ids
    of their (other) database. Also one line per previous entry faster, beyond timing noise, than
    the one exported instead."""
    kept: dict[str, int] = {}
    slower: list[str] = []
    for kernel, shapes in previous.get("entries", {}).items():
        if kernel in skip:
            continue
        for key, entry in shapes.items():
            new = table["entries"].get(kernel, {}).get(key)
            if new is not None:
                old_time, new_time = entry_time(entry), entry_time(new)
                if old_time is None or new_time is None or pick([new_time, old_time], lambda t: t, rank) is new_time:
                    continue
                old_ms, new_ms = (time.ms(common_rank(rank, (old_time, new_time))) for time in (old_time, new_time))
                if ALL not in fastest and kernel not in fastest:
                    if new_ms > old_ms * (1 + REGRESSION_TOLERANCE):
                        slower.append(f"{kernel} {key}: this export's entry takes {new_ms:.4g} ms, the merged "
                                      f"table's {old_ms:.4g} ms")
                    continue
            table["entries"].setdefault(kernel, {})[key] = entry
            kept[kernel] = kept.get(kernel, 0) + 1
    if not kept:
        return table, slower
    old, new = previous.get("provenance", {}), table["provenance"]
    for field in ("devices", "sm_counts", "hosts"):
        new[field] = sorted(set(new[field]) | set(old.get(field, [])))
    new["toolchains"] = new["toolchains"] + [t for t in old.get("toolchains", []) if t not in new["toolchains"]]
    # Sweep ids are per database: the kept entries' ids are listed apart, never mixed with this export's.
    new["kept_from"] = {"exported_at": old.get("exported_at"), "sweep_ids": old.get("sweep_ids", []),
                        "entries": dict(sorted(kept.items()))}
    if "kept_from" in old:  # that table kept entries of an older one in turn: the chain stays readable
        new["kept_from"]["kept_from"] = old["kept_from"]
    return table, slower


def _previous_table(path: Path, arch: str) -> dict[str, Any]:
    """The table an export keeps entries of: the one at ``path``, if any."""
    if not path.exists():
        return {}
    try:
        return read_table(path, arch)
    except TableError as exc:
        raise ExportError(f"cannot keep the entries of {exc} (--no-merge replaces it)") from None


def tables_folder(out_dir: Path | None) -> Path:
    """Where an export writes: ``out_dir`` (default: the user's tables folder), refused when it is not a folder."""
    folder = out_dir or user_tables_dir()
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"--out: {folder} is not a folder")
    return folder


def export_table(engine: Engine, arch: str, out_dir: Path | None = None, skip: Sequence[str] = (),
                 fastest: Sequence[str] = (), merge: bool = True, rank: Rank = DEFAULT_RANK) -> tuple[Path, list[str]]:
    """Write ``<out_dir>/<arch>.json`` atomically; its path and the :func:`regressions` of what it holds
    (with ``merge``, also the merged table's entries faster than what replaced them).

    ``skip`` leaves kernels out (their launches then use the heuristic default), e.g. while
    their sweeps are known to be unfinished; ``fastest`` (see :func:`best_trials`). The table's
    provenance lists both. ``merge`` keeps the existing table's entries the database cannot
    replace (see the module doc). Times compare under ``rank``.
    """
    if rank not in RANKS:
        raise NothingToExport(f"--rank: {rank!r} is not one of {', '.join(RANKS)}")
    rows = _ok_trials(engine, arch)
    trials = _choose(rows, fastest, rank)
    path = table_path(arch, tables_folder(out_dir))
    previous = _previous_table(path, arch) if merge else {}
    # A kernel named to an option must have trials here or, with merge, entries in the kept table
    # (a typo is refused either way): skipping one the database lacks drops it from the kept table.
    known = {t.kernel for t in trials} | set(previous.get("entries", {}))
    for option, kernels in (("--skip-kernel", set(skip)), ("--fastest", set(fastest) - {ALL})):
        unknown = sorted(kernels - known)
        if unknown:
            where = "in the database" + (f" or the table {path}" if merge else "")
            raise NothingToExport(f"{option}: no ok trials of {unknown} for arch {arch!r} {where}")
    trials = [t for t in trials if t.kernel not in skip]
    if not trials:
        raise NothingToExport(f"no ok trials for arch {arch!r} in the database")
    table = build_table(trials, arch, skip, fastest, rank)
    slower = regressions(trials, _choose(rows, (ALL,), rank), rank)
    if merge:
        table, slower_than_kept = _merged(table, previous, skip, fastest, rank)
        slower += slower_than_kept
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{arch}.", suffix=".json")
    except OSError as exc:
        raise ExportError(f"--out: cannot write in {path.parent}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path, slower
