"""Declarative search spaces: launch parameters, per-backend compiler knobs, constraints.

Each kernel's default space is a YAML file ``search_spaces/<kernel>.yaml`` (format in the
README). Constraints are Python expressions evaluated with no builtins over the config,
the shape fields and the arch facts, so impossible configs are pruned before a worker
ever compiles them.
"""

from __future__ import annotations

import itertools
import math
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from kernels.host_math import cdiv, next_pow2
from search_spaces.arch_facts import arch_facts

SPACES_DIR = Path(__file__).resolve().parent
BACKENDS = ("cuda", "hip", "interp")


EXPRESSION_FUNCTIONS = {"next_pow2": next_pow2, "cdiv": cdiv, "min": min, "max": max, "log2": math.log2}


class SpaceError(ValueError):
    """A search space file or override that cannot be used."""


class SearchSpace(BaseModel):
    """The launch parameters of one kernel, with their choices and constraints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kernel: str
    params: dict[str, list[Any]]
    knobs: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    constraints: list[str] = Field(default_factory=list)
    shared_memory_bytes: str = "0"

    @field_validator("params")
    @classmethod
    def _nonempty_choices(cls, params: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, choices in params.items():
            if not choices:
                raise ValueError(f"parameter {name!r} has no choices")
        return params

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, knobs: dict[str, dict[str, list[Any]]], info: ValidationInfo) -> dict[str, dict[str, list[Any]]]:
        """Backends and knob names ``kernels.launch`` passes on to Triton: any other would be a dimension
        a sweep explores for nothing. Not checked for a stored sweep's space (``check_knobs=False``:
        it was checked when the sweep was queued), which reads no torch or triton."""
        unknown = set(knobs) - set(BACKENDS)
        if unknown:
            raise ValueError(f"unknown backends {sorted(unknown)}; use {list(BACKENDS)}")
        if info.context and not info.context.get("check_knobs", True):
            return knobs
        from kernels.launch import ENVIRONMENT_KNOBS, LAUNCH_KNOBS  # torch and triton: only where spaces load

        for backend, named in knobs.items():
            known = {*LAUNCH_KNOBS.get(backend, ()), *ENVIRONMENT_KNOBS.get(backend, {})}
            if set(named) - known:
                raise ValueError(f"unknown {backend} knobs {sorted(set(named) - known)}; "
                                 f"kernels.launch passes on {sorted(known) or 'none'}")
        return knobs

    @field_validator("constraints")
    @classmethod
    def _compilable(cls, constraints: list[str]) -> list[str]:
        for expression in constraints:
            try:
                compile(expression, "<constraint>", "eval")
            except SyntaxError as exc:
                raise ValueError(f"constraint {expression!r} is not a Python expression: {exc.msg}") from None
        return constraints

    @cached_property
    def _compiled(self) -> list[tuple[str, Any]]:
        return [(e, compile(e, "<constraint>", "eval")) for e in self.constraints]

    @cached_property
    def _compiled_smem(self) -> Any:
        return compile(self.shared_memory_bytes, "<shared_memory_bytes>", "eval")

    def dimensions(self, arch: str) -> dict[str, list[Any]]:
        """Every tunable of this space on ``arch``: the params plus that backend's knobs, less the knob
        values the arch's compiler overrides (``ignored_knob_values``; a sweep would time one binary
        twice). A knob left with no value is left to the compiler."""
        facts = arch_facts(arch)
        ignored = facts.get("ignored_knob_values", {})
        knobs = {name: [v for v in choices if v not in ignored.get(name, ())]
                 for name, choices in self.knobs.get(facts["backend"], {}).items()}
        return {**self.params, **{name: choices for name, choices in knobs.items() if choices}}

    def size(self, arch: str) -> int:
        return math.prod(len(c) for c in self.dimensions(arch).values())

    def grid(self, arch: str) -> list[dict[str, Any]]:
        """The full cartesian product of choices on ``arch``, before constraints."""
        dims = self.dimensions(arch)
        return [dict(zip(dims, values)) for values in itertools.product(*dims.values())]

    def violation(self, config: dict[str, Any], shape: dict[str, int], arch: str) -> str | None:
        """Why ``config`` cannot run at ``shape`` on ``arch``, or None when it can.

        Expressions may name ``maxnreg``, the config's register cap: None where it sets none or the
        arch has no such knob.
        """
        facts = arch_facts(arch)
        names = {**EXPRESSION_FUNCTIONS, **facts, "maxnreg": None, **shape, **config}
        for text, code in self._compiled:
            if not eval(code, {"__builtins__": {}}, names):  # noqa: S307 - expressions from space files
                return f"constraint violated: {text}"
        smem = eval(self._compiled_smem, {"__builtins__": {}}, names)  # noqa: S307
        if smem > facts["smem_bytes"]:
            return f"needs {smem} B shared memory > {facts['smem_bytes']} B on {arch}"
        return None

    def with_overrides(self, overrides: dict[str, list[Any]]) -> SearchSpace:
        """A copy whose named params/knobs take the given choices; unknown names are an error."""
        params = dict(self.params)
        knobs = {b: dict(k) for b, k in self.knobs.items()}
        for name, choices in overrides.items():
            if not isinstance(choices, list) or not choices:
                raise SpaceError(f"override of {name!r} must be a non-empty list of choices")
            defaults = params.get(name) or [v for k in knobs.values() for v in k.get(name, ())]
            for value in choices:
                problem = _choice_problem(value, defaults)
                if problem:
                    raise SpaceError(f"{name}: {value!r} {problem}")
            if name in params:
                params[name] = choices
                continue
            backends = [b for b, k in knobs.items() if name in k]
            if not backends:
                known = sorted({*params, *(n for k in knobs.values() for n in k)})
                raise SpaceError(f"{name!r} is not a parameter of {self.kernel}; known: {known}")
            for backend in backends:
                knobs[backend][name] = choices
        return self.model_copy(update={"params": params, "knobs": knobs})


def _choice_problem(value: Any, defaults: list[Any]) -> str | None:
    """Why ``value`` cannot stand among a tunable whose default choices are ``defaults``, or None: it must
    be a scalar of a kind the defaults take, null only where they have null, and zero or negative only
    where they have such a number."""
    if value is None:
        return None if None in defaults else "is null; this tunable takes no null"
    if not isinstance(value, (bool, int, float, str)):
        return "is not a number or string"
    kinds = {_kind(v) for v in defaults if v is not None}
    if kinds and _kind(value) not in kinds:
        return f"is a {_kind(value)}; this tunable takes {' or '.join(sorted(kinds))} values"
    numbers = [v for v in defaults if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if _kind(value) == "number" and value <= 0 and not any(v <= 0 for v in numbers):
        return "must be positive"
    if _kind(value) == "number" and abs(value) > 2**63 - 1:
        return "is beyond 64 bits"
    return None


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, (int, float)) else "string"


def space_dirs() -> list[Path]:
    """Folders searched for ``<kernel>.yaml``: ``TUNER_SPACES_PATH`` entries, then this package."""
    extra = [Path(p) for p in os.environ.get("TUNER_SPACES_PATH", "").split(os.pathsep) if p]
    return [*extra, SPACES_DIR]


def load_space(kernel: str, check_knobs: bool = True) -> SearchSpace:
    """The default search space of ``kernel``: the first ``<kernel>.yaml`` in ``space_dirs()``; its knobs
    checked against ``kernels.launch`` unless ``check_knobs`` is False (see ``_known_knobs``)."""
    candidates = [d / f"{kernel}.yaml" for d in space_dirs()]
    path = next((c for c in candidates if c.exists()), None)
    if path is None:
        raise SpaceError(f"no search space for kernel {kernel!r} (looked for {[str(c) for c in candidates]})")
    try:
        data = yaml.safe_load(path.read_text())
        return SearchSpace.model_validate(data, context={"check_knobs": check_knobs})
    except (yaml.YAMLError, ValueError) as exc:
        raise SpaceError(f"{path}: {exc}") from None
