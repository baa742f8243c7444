"""Run-time launch-parameter lookup: env override > tuned table (nearest shape) > default.

Every kernel launch in this project resolves its config through ``resolve``. Rules:

* ``TUNER_CONFIG_<KERNEL>`` (kernel name upper-cased, e.g. ``TUNER_CONFIG_RMSNORM_FWD``)
  holds a JSON object; its keys override the heuristic default. Source ``env``.
* Otherwise the running arch's table ``<arch>.json`` is read from ``TUNER_TABLES_DIR``
  when set, else from the packaged ``kernels/tables/``. An entry whose shape equals the
  asked shape wins; else, among entries whose ``exact_fields`` match, the one nearest in
  summed |log2| distance over the remaining fields (ties: the smaller shape key). Source
  ``table``. An entry's keys are laid over the default, so an entry written for an older
  space (fewer parameters) still launches.
* Otherwise the kernel's heuristic default. Source ``default``. ``TUNER_TABLES=off`` skips the
  tables, so every launch takes this (a benchmark's untuned baseline).

A missing, unreadable or wrong-schema table never breaks a kernel: the lookup warns once
and falls back. Results are cached per (kernel, shape), so a lookup costs a dict hit.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal

from kernels import registry
from kernels.arch import current_arch

TABLE_SCHEMA_VERSION = 1
PACKAGED_TABLES = Path(__file__).resolve().parent / "tables"
Source = Literal["env", "table", "default"]


class ConfigOverrideError(ValueError):
    """A ``TUNER_CONFIG_*`` variable that is not a JSON object."""


def table_path(arch: str, directory: Path | None = None) -> Path:
    """Where the table of ``arch`` lives; shared by the exporter and the lookup."""
    return (directory or PACKAGED_TABLES) / f"{arch}.json"


def env_var_name(kernel: str) -> str:
    return "TUNER_CONFIG_" + kernel.upper().replace("-", "_").replace(".", "_")


@functools.lru_cache(maxsize=None)
def load_table(arch: str) -> dict[str, Any] | None:
    """The table of ``arch`` (override folder first), or None with a one-time warning.

    ``TUNER_TABLES=off`` reads no table at all: every launch at its heuristic default (the
    baseline the benchmarks compare a tuned table against)."""
    if os.environ.get("TUNER_TABLES") == "off":
        return None
    override = os.environ.get("TUNER_TABLES_DIR")
    candidates = [table_path(arch, Path(override))] if override else []
    candidates.append(table_path(arch))
    for path in candidates:
        if not path.exists():
            continue
        try:
            table = json.loads(path.read_text())
            if table.get("schema_version") != TABLE_SCHEMA_VERSION or not isinstance(
                table.get("entries"), dict
            ):
                raise ValueError(f"schema_version must be {TABLE_SCHEMA_VERSION} with an 'entries' object")
            return table
        except (OSError, ValueError, AttributeError) as exc:
            warnings.warn(f"tuned table {path} is unusable ({exc}); using heuristic defaults", stacklevel=2)
            return None
    warnings.warn(f"no tuned table for arch {arch!r}; using heuristic defaults", stacklevel=2)
    return None


def nearest_entry(
    kernel: registry.TunableKernel, shape: registry.Shape, entries: dict[str, Any]
) -> dict[str, Any] | None:
    """The table entry for ``shape``: exact key, else nearest with matching exact fields."""
    key = kernel.shape_key(shape)
    if key in entries:
        return entries[key]
    best: tuple[float, str] | None = None
    for other_key in entries:
        other = registry.parse_shape_key(other_key)
        if set(other) != set(kernel.shape_fields):
            continue
        if any(other[f] != shape[f] for f in kernel.exact_fields):
            continue
        distance = sum(
            abs(math.log2(max(other[f], 1)) - math.log2(max(shape[f], 1)))
            for f in kernel.shape_fields
            if f not in kernel.exact_fields
        )
        if best is None or (distance, other_key) < best:
            best = (distance, other_key)
    return entries[best[1]] if best else None


@functools.lru_cache(maxsize=4096)
def _resolve_cached(
    name: str, shape_items: tuple[tuple[str, int], ...], arch: str
) -> tuple[dict[str, Any], Source]:
    kernel = registry.get(name)
    shape = dict(shape_items)
    raw = os.environ.get(env_var_name(name))
    if raw:
        try:
            override = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigOverrideError(f"{env_var_name(name)} is not valid JSON: {exc}") from None
        if not isinstance(override, dict):
            raise ConfigOverrideError(f"{env_var_name(name)} must be a JSON object, got {raw!r}")
        return {**kernel.default_config(shape), **override}, "env"
    table = load_table(arch)
    if table is not None:
        entry = nearest_entry(kernel, shape, table["entries"].get(name, {}))
        if entry is not None:
            return {**kernel.default_config(shape), **entry["config"]}, "table"
    return kernel.default_config(shape), "default"


def resolve(kernel: str, shape: registry.Shape) -> tuple[dict[str, Any], Source]:
    """The launch config for ``kernel`` at ``shape`` on the running arch, and where it came from."""
    config, source = _resolve_cached(kernel, tuple(sorted(shape.items())), current_arch())
    return dict(config), source


def clear_cache() -> None:
    """Forget cached lookups and tables (after an export, or when env overrides change)."""
    _resolve_cached.cache_clear()
    load_table.cache_clear()
