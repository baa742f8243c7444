"""The packages form layers, lowest first: ``kernels`` and ``db``; ``search_spaces`` and ``v4`` (on
kernels); ``workers`` (on kernels and v4); ``tuner`` on top. A module may import its own package and
the layers below it, never one above: the import statements (module level and inside functions) of
every file are read, so a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what each top-level package may import of the project's other packages
ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "db": set(),
    "search_spaces": {"kernels"},
    "v4": {"kernels"},
    "workers": {"kernels", "v4"},
    "tuner": {"kernels", "db", "search_spaces", "v4", "workers"},
}


def project_imports(path: Path) -> set[str]:
    """The project packages ``path`` imports (absolute imports only; the project uses no relative ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in ALLOWED)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_package_imports_a_layer_above_it(package):
    wrong = {f"{path.relative_to(ROOT)} imports {other}"
             for path in sorted((ROOT / package).rglob("*.py"))
             for other in project_imports(path) - ALLOWED[package] - {package}}
    assert not wrong, sorted(wrong)


def test_the_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from tuner.sweep import queue\n    import v4.layout\n")
    assert project_imports(module) == {"tuner", "v4"}
