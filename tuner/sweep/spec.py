"""The sweep spec: what a user writes in YAML to queue a launch-parameter sweep.

Validated by pydantic; every error names the field path and the reason, and nothing is
written to the database before the whole spec (space overrides included) is valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from kernels import registry
from search_spaces import ARCH_FACTS, SearchSpace, SpaceError, load_space
from tuner.sweep.ranking import DEFAULT_RANK, Rank


class SpecError(ValueError):
    """A sweep spec that cannot be queued; the message lists ``field: reason`` lines."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Strategy(_Strict):
    name: Literal["grid", "random", "tpe"] = "grid"
    seed: int = 0


class Budget(_Strict):
    max_trials: PositiveInt | None = Field(None, description="evaluated configs per shape")
    max_minutes: PositiveFloat | None = Field(None, description="wall time of the whole sweep")


class TimingSettings(_Strict):
    """Screening every config is short; the few best are re-timed longer, together, at the end."""

    warmup_ms: PositiveFloat = 5.0
    rep_ms: PositiveFloat = 20.0
    trial_timeout_s: PositiveFloat = 120.0
    retime_top: int = Field(5, ge=1, description="best configs re-timed together at the end")
    retime_rounds: PositiveInt = 3
    retime_warmup_ms: PositiveFloat = 25.0
    retime_rep_ms: PositiveFloat = 100.0
    method: Literal["events", "cudagraph"] = Field(
        "events", description="cudagraph: device time without host launch cost (microsecond kernels)")
    rank: Rank = Field(DEFAULT_RANK, description="how the winner is picked: device time (CUDA-graph steps, and "
                       "the default: host times are noisy), or eager: the longer of device and host time, what "
                       "back-to-back eager calls run at (tuner.sweep.ranking)")
    input_seed: int = 0


class Tolerance(_Strict):
    atol: PositiveFloat
    rtol: PositiveFloat


class SweepSpec(_Strict):
    """One sweep: a kernel over shapes on an arch, searched by a strategy within a budget."""

    kernel: str
    shapes: str | list[dict[str, int]]
    arch: str = "auto"
    space: dict[str, list[Any]] = Field(default_factory=dict)
    strategy: Strategy = Field(default_factory=Strategy)
    budget: Budget = Field(default_factory=Budget)
    timing: TimingSettings = Field(default_factory=TimingSettings)
    tolerance: Tolerance | None = None

    @model_validator(mode="after")
    def _check_against_kernel(self) -> SweepSpec:
        try:
            kernel = registry.get(self.kernel)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        if isinstance(self.shapes, str) and self.shapes not in kernel.presets:
            raise ValueError(f"shapes: unknown preset {self.shapes!r}; presets of {self.kernel}: {sorted(kernel.presets)}")
        for i, shape in enumerate(self.resolved_shapes()):
            try:
                kernel.shape_key(shape)
            except KeyError as exc:
                raise ValueError(f"shapes[{i}]: {exc.args[0]}") from None
            if any(v < 0 for v in shape.values()):  # 0 is meaningful for some fields (no skew, no top-k)
                raise ValueError(f"shapes[{i}]: every dimension must be >= 0, got {shape}")
        if self.arch != "auto" and self.arch not in ARCH_FACTS:
            raise ValueError(f"arch: unknown arch {self.arch!r}; use 'auto' or one of {sorted(ARCH_FACTS)}")
        if self.strategy.name != "grid" and self.budget.max_trials is None and self.budget.max_minutes is None:
            raise ValueError(f"budget: strategy {self.strategy.name!r} needs max_trials or max_minutes")
        try:
            self.search_space()
        except SpaceError as exc:
            raise ValueError(f"space: {exc}") from None
        return self

    def resolved_shapes(self) -> list[dict[str, int]]:
        """The explicit shapes, or the preset's."""
        if isinstance(self.shapes, str):
            return [dict(s) for s in registry.get(self.kernel).presets[self.shapes]]
        return self.shapes

    def search_space(self) -> SearchSpace:
        """The kernel's default space with this spec's overrides applied."""
        return load_space(self.kernel).with_overrides(self.space)

    def trial_budget(self, arch: str) -> int:
        """Configs evaluated per shape: the whole grid, capped by ``budget.max_trials``."""
        grid = self.search_space().size(arch)
        return min(grid, self.budget.max_trials) if self.budget.max_trials else grid

    @property
    def budget_counts_pruned(self) -> bool:
        """An uncapped grid is done when every point was evaluated or pruned."""
        return self.strategy.name == "grid" and not self.budget.max_trials

    def tolerances(self) -> tuple[float, float]:
        kernel = registry.get(self.kernel)
        return (self.tolerance.atol, self.tolerance.rtol) if self.tolerance else (kernel.atol, kernel.rtol)


def format_validation_error(exc: ValidationError) -> str:
    """One ``field.path: reason`` line per problem."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"]) or "<spec>"
        lines.append(f"{path}: {error['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def parse_spec(data: Any) -> SweepSpec:
    """A validated spec from already-parsed YAML/JSON data."""
    if not isinstance(data, dict):
        raise SpecError("<spec>: must be a mapping of fields (kernel, shapes, ...)")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc)) from None


def load_spec(path: Path) -> SweepSpec:
    """Read and validate a YAML spec file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
