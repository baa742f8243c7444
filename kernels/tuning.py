"""Run-time launch-parameter lookup: env override > user table > shipped table > default.

Every kernel launch in this project resolves its config through ``resolve``. Rules:

* ``TUNER_CONFIG_<KERNEL>`` (kernel name upper-cased, e.g. ``TUNER_CONFIG_RMSNORM_FWD``)
  holds a JSON object; its keys override the heuristic default. Source ``env``.
* Otherwise the running arch's tables ``<arch>.json``: the user's (``TUNER_TABLES_DIR`` when set,
  else ``<user data dir>/tables``, where ``tuner export`` writes) laid entry by entry over the
  shipped one (``kernels/tables/``, never written by the tool). An entry whose shape equals the
  asked shape wins; else, among entries whose ``exact_fields`` match, the one nearest in summed
  |log2| distance over the remaining fields (ties: the smaller shape key). Source ``table``. An
  entry's keys are laid over the default, so an entry written for an older space still launches.
* Otherwise the kernel's heuristic default. Source ``default``. ``TUNER_TABLES=off`` reads no
  table at all, so every launch takes its default (a benchmark's untuned baseline).

A missing, unreadable or wrong-schema table never breaks a kernel, nor does a corrupt entry (a
config that is not an object, unknown keys, values of the wrong type, a shape key with wrong or
non-integer fields): the lookup warns once and skips it. Results are cached per (kernel, shape),
so a lookup costs a dict hit.

This module imports neither torch nor the kernels (the CLI reads tables through it); the registry
and the arch are imported by the first lookup.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal

if TYPE_CHECKING:
    from kernels.registry import Shape, TunableKernel

TABLE_SCHEMA_VERSION = 1
SHIPPED_TABLES = Path(__file__).resolve().parent / "tables"
TABLES_DIR_VARIABLE = "TUNER_TABLES_DIR"
Source = Literal["env", "table", "default"]
Layer = Literal["user", "shipped"]
_SCALARS = (bool, int, float, str)


class ConfigOverrideError(ValueError):
    """A ``TUNER_CONFIG_*`` variable that is not a JSON object."""


class TableError(ValueError):
    """A table file that cannot be read as a tuned table; the message names the file and the reason."""


def user_tables_dir() -> Path:
    """Where exports go and the user layer is read: ``TUNER_TABLES_DIR``, else the user data dir's ``tables``."""
    override = os.environ.get(TABLES_DIR_VARIABLE)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("v4-tuner")) / "tables"


def table_path(arch: str, directory: Path | None = None) -> Path:
    """Where the table of ``arch`` lives in ``directory`` (default: the shipped tables); shared by the
    exporter and the lookup."""
    return (directory or SHIPPED_TABLES) / f"{arch}.json"


def env_var_name(kernel: str) -> str:
    return "TUNER_CONFIG_" + kernel.upper().replace("-", "_").replace(".", "_")


def read_table(path: Path, arch: str | None = None) -> dict[str, Any]:
    """The table in ``path``, checked down to its entries' shape (an object of kernels, each an object
    of entries); :class:`TableError` naming the file and what is wrong otherwise."""
    try:
        if not path.is_file():
            raise TableError(f"{path}: not a regular file")
        text = path.read_bytes().decode("utf-8")
        table = json.loads(text)
    except OSError as exc:
        raise TableError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TableError(f"{path}: not UTF-8 text (a binary file?)") from None
    except RecursionError:
        raise TableError(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise TableError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(table, dict) or table.get("schema_version") != TABLE_SCHEMA_VERSION:
        raise TableError(f"{path}: not a tuned table (schema_version must be {TABLE_SCHEMA_VERSION})")
    if arch is not None and table.get("arch") != arch:
        raise TableError(f"{path}: arch is {table.get('arch')!r}, not {arch!r}")
    entries = table.get("entries")
    if not isinstance(entries, dict) or not all(isinstance(shapes, dict) for shapes in entries.values()):
        raise TableError(f"{path}: 'entries' must be an object of kernels, each an object of shape entries")
    if not isinstance(table.get("provenance", {}), dict):
        raise TableError(f"{path}: 'provenance' must be an object")
    return table


@dataclass(frozen=True)
class TableLayer:
    """One readable table of an arch: which layer, where, and its content."""

    layer: Layer
    path: Path
    table: dict[str, Any]


def table_layers(arch: str, warn: bool = True) -> list[TableLayer]:
    """The readable tables of ``arch``, shipped first, then the user's laid over it; with ``warn``, an
    unreadable one is skipped with a warning (the CLI asks with ``warn=False`` and reports it)."""
    layers = []
    for layer, path in (("shipped", table_path(arch)), ("user", table_path(arch, user_tables_dir()))):
        if not path.exists():
            continue
        try:
            layers.append(TableLayer(layer, path, read_table(path, arch)))
        except TableError as exc:
            if not warn:
                raise
            warnings.warn(f"tuned table {exc}; its entries are skipped", stacklevel=3)
    return layers


@functools.lru_cache(maxsize=None)
def _layers(arch: str) -> tuple[TableLayer, ...]:
    if os.environ.get("TUNER_TABLES") == "off":
        return ()
    layers = tuple(table_layers(arch))
    if not layers:
        warnings.warn(f"no tuned table for arch {arch!r}; using heuristic defaults", stacklevel=3)
    return layers


def merged_entries(layers: list[TableLayer] | tuple[TableLayer, ...]) -> dict[str, dict[str, tuple[Layer, Any]]]:
    """Per kernel and shape key, the entry in use and its layer: the user's over the shipped."""
    merged: dict[str, dict[str, tuple[Layer, Any]]] = {}
    for layer in layers:
        for kernel, shapes in layer.table["entries"].items():
            merged.setdefault(kernel, {}).update({key: (layer.layer, entry) for key, entry in shapes.items()})
    return merged


@functools.lru_cache(maxsize=None)
def load_table(arch: str) -> dict[str, Any] | None:
    """The table the kernels of ``arch`` read (the user's entries over the shipped ones, the top layer's
    provenance), or None with a one-time warning."""
    layers = _layers(arch)
    if not layers:
        return None
    entries = {kernel: {key: entry for key, (_, entry) in shapes.items()}
               for kernel, shapes in merged_entries(layers).items()}
    return {**layers[-1].table, "entries": entries}


def _parsed_key(kernel: TunableKernel, key: str) -> tuple[dict[str, int] | None, str | None]:
    """The shape a table's shape key stands for, or why it stands for none of ``kernel``'s."""
    fields: dict[str, int] = {}
    for part in key.split(","):
        name, _, value = part.partition("=")
        try:
            fields[name] = int(value)
        except ValueError:
            return None, f"shape field {name!r} is not an integer ({value!r})"
    if set(fields) != set(kernel.shape_fields) or len(fields) != key.count(",") + 1:
        return None, f"shape fields must be {list(kernel.shape_fields)}"
    return fields, None


def _config_problem(config: Any, default: dict[str, Any]) -> str | None:
    """Why a table entry's config cannot be launched where ``default`` is the heuristic's, or None."""
    from kernels.launch import ENVIRONMENT_KNOBS, LAUNCH_KNOBS

    if not isinstance(config, dict):
        return f"its config is {config!r}, not an object"
    knobs = {name for names in (*LAUNCH_KNOBS.values(), *ENVIRONMENT_KNOBS.values()) for name in names}
    for name, value in config.items():
        if name not in default and name not in knobs:
            return f"unknown parameter {name!r}"
        if name in knobs and value is None:
            continue
        if not isinstance(value, _SCALARS):
            return f"{name} is {value!r}, not a number or string"
        expected = default.get(name)
        if expected is not None and not _same_kind(value, expected):
            return f"{name} is {value!r}, of another type than the default's {expected!r}"
    return None


def _same_kind(value: Any, expected: Any) -> bool:
    """Whether ``value`` can stand where the default has ``expected`` (an int where a float is fine)."""
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(value, bool) == isinstance(expected, bool) or value in (0, 1)
    if isinstance(expected, (int, float)):
        return isinstance(value, (int, float)) and (isinstance(expected, float) or float(value).is_integer())
    return type(value) is type(expected)


@functools.lru_cache(maxsize=None)
def _kernel_entries(name: str, arch: str) -> dict[str, tuple[dict[str, int], dict[str, Any]]]:
    """The launchable entries of kernel ``name`` on ``arch``, each layer's checked before they are laid
    one over the other (a corrupt user entry leaves the shipped one in place); one warning per layer
    that had corrupt entries, naming them."""
    from kernels import registry

    kernel = registry.get(name)
    usable: dict[str, tuple[dict[str, int], dict[str, Any]]] = {}
    for layer in _layers(arch):
        bad = []
        for key, entry in layer.table["entries"].get(name, {}).items():
            shape, problem = _parsed_key(kernel, key)
            config = entry.get("config") if isinstance(entry, dict) else entry
            if shape is not None:
                try:
                    problem = _config_problem(config, kernel.default_config(shape))
                except (ArithmeticError, ValueError, KeyError):
                    problem = "the kernel has no default config at that shape"
            if problem:
                bad.append(f"{key!r} ({problem})")
            else:
                usable[key] = (shape, config)
        if bad:
            warnings.warn(f"tuned table {layer.path}: {name} entries skipped: {'; '.join(bad)}", stacklevel=4)
    return usable


def nearest_entry(kernel: TunableKernel, shape: Shape, entries: dict[str, Any]) -> Any | None:
    """The table entry for ``shape``: exact key, else nearest with matching exact fields. ``entries``
    maps shape keys to entries; keys that do not parse as this kernel's shapes are passed over."""
    from kernels import registry

    key = kernel.shape_key(shape)
    if key in entries:
        return entries[key]
    best: tuple[float, str] | None = None
    for other_key in entries:
        try:
            other = registry.parse_shape_key(other_key)
        except ValueError:
            continue
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
    from kernels import registry

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
    found = nearest_entry(kernel, shape, _kernel_entries(name, arch))
    if found is not None:
        return {**kernel.default_config(shape), **found[1]}, "table"
    return kernel.default_config(shape), "default"


_recorders: list[list[tuple[str, Shape]]] = []


def resolve(kernel: str, shape: Shape) -> tuple[dict[str, Any], Source]:
    """The launch config for ``kernel`` at ``shape`` on the running arch, and where it came from."""
    from kernels.arch import current_arch  # a dict hit after the first lookup

    for asked in _recorders:
        asked.append((kernel, dict(shape)))
    config, source = _resolve_cached(kernel, tuple(sorted(shape.items())), current_arch())
    return dict(config), source


@contextlib.contextmanager
def recorded_lookups() -> Iterator[list[tuple[str, Shape]]]:
    """Inside ``with``, every ``resolve`` call's (kernel, shape), in order, repeats included."""
    asked: list[tuple[str, Shape]] = []
    _recorders.append(asked)
    try:
        yield asked
    finally:
        _recorders.remove(asked)


def source_on(kernel: str, shape: Shape, arch: str) -> Source:
    """Where a launch of ``kernel`` at ``shape`` on ``arch`` would take its config from: ``env``,
    ``table`` (an entry of that arch's tables, the nearest) or ``default``."""
    return _resolve_cached(kernel, tuple(sorted(shape.items())), arch)[1]


def clear_cache() -> None:
    """Forget cached lookups and tables (after an export, or when env overrides change)."""
    _resolve_cached.cache_clear()
    _kernel_entries.cache_clear()
    load_table.cache_clear()
    _layers.cache_clear()
