"""The sweep spec: what a user writes in YAML to queue a launch-parameter sweep.

Validated by pydantic; every error names the field path and the reason, and nothing is
written to the database before the whole spec (space overrides included) is valid. A valid
spec names its shapes explicitly, in the kernel's field order (a preset is resolved when the
spec is validated), so that a spec read back from the database (:func:`stored_spec`) gives its
shape keys without the kernel registry, which imports torch and the kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, PrivateAttr, StrictInt, ValidationError,
                      ValidationInfo, model_validator)

from search_spaces import ARCH_FACTS, SearchSpace, SpaceError, load_space
from search_spaces.space import space_dirs
from tuner.sweep.ranking import DEFAULT_RANK, Rank

INT64_MAX = 2**63 - 1
SEED_MAX = 2**32 - 1  # numpy's and Optuna's samplers take 32-bit seeds
Seed = Field(0, ge=0, le=SEED_MAX)


class SpecError(ValueError):
    """A sweep spec that cannot be queued; the message lists ``field: reason`` lines."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Strategy(_Strict):
    name: Literal["grid", "random", "tpe"] = "grid"
    seed: int = Seed


class Budget(_Strict):
    max_trials: PositiveInt | None = Field(None, le=INT64_MAX, description="evaluated configs per shape")
    max_minutes: PositiveFloat | None = Field(None, description="wall time of the whole sweep")


class TimingSettings(_Strict):
    """Screening every config is short; the few best are re-timed longer, together, at the end."""

    warmup_ms: PositiveFloat = 5.0
    rep_ms: PositiveFloat = 20.0
    probe_ms: PositiveFloat = Field(4.0, description="each config's first repetitions: one whose median is "
                                    "already over probe_cutoff x the shape's best so far stops there")
    probe_cutoff: float | None = Field(1.25, gt=1.0, description="null: every config timed whole; never under "
                                       "rank eager, where a slower launch may still win on host time")
    trial_timeout_s: PositiveFloat = 120.0
    retime_top: int = Field(5, ge=1, le=INT64_MAX, description="best configs re-timed together at the end")
    retime_rounds: PositiveInt = Field(3, le=INT64_MAX)
    retime_warmup_ms: PositiveFloat = 25.0
    retime_rep_ms: PositiveFloat = 100.0
    method: Literal["events", "cudagraph"] = Field(
        "events", description="cudagraph: device time without host launch cost (microsecond kernels)")
    rank: Rank = Field(DEFAULT_RANK, description="how the winner is picked: device time (CUDA-graph steps, and "
                       "the default: host times are noisy), or eager: the longer of device and host time, what "
                       "back-to-back eager calls run at (tuner.sweep.ranking)")
    input_seed: int = Seed


class Tolerance(_Strict):
    atol: PositiveFloat
    rtol: PositiveFloat


class SweepSpec(_Strict):
    """One sweep: a kernel over shapes on an arch, searched by a strategy within a budget."""

    kernel: str
    shapes: str | list[dict[str, StrictInt]] = Field(min_length=1)
    arch: str = "auto"
    space: dict[str, list[Any]] = Field(default_factory=dict)
    strategy: Strategy = Field(default_factory=Strategy)
    budget: Budget = Field(default_factory=Budget)
    timing: TimingSettings = Field(default_factory=TimingSettings)
    tolerance: Tolerance | None = None
    _stored: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> SweepSpec:
        """``mode`` (validation context): ``full`` checks against the kernel registry (imports torch and the
        kernels); ``early`` checks what needs no kernel module, so that a command can refuse most bad
        specs before it starts anything; ``stored`` checks nothing more (queued specs were checked)."""
        mode = (info.context or {}).get("mode", "full")
        if mode == "stored":
            self._stored = True
            return self
        if mode == "full":
            self._check_against_kernel()
        for i, shape in enumerate(self.shapes if isinstance(self.shapes, list) else []):
            for field, value in shape.items():  # the bounds of every kernel; full checks 0 against the kernel's
                if not 0 <= value <= INT64_MAX:
                    raise ValueError(f"shapes[{i}].{field}: every dimension must be >= 0 and < 2**63, got {value}")
        if self.arch != "auto" and self.arch not in ARCH_FACTS:
            raise ValueError(f"arch: unknown arch {self.arch!r}; use 'auto' or one of {sorted(ARCH_FACTS)}")
        if self.strategy.name != "grid" and self.budget.max_trials is None and self.budget.max_minutes is None:
            raise ValueError(f"budget: strategy {self.strategy.name!r} needs max_trials or max_minutes")
        if not any((folder / f"{self.kernel}.yaml").exists() for folder in space_dirs()):
            raise ValueError(f"unknown kernel {self.kernel!r}: no search space {self.kernel}.yaml")
        try:
            load_space(self.kernel, check_knobs=mode == "full").with_overrides(self.space)
        except SpaceError as exc:
            raise ValueError(f"space: {exc}") from None
        return self

    def _check_against_kernel(self) -> None:
        """The kernel exists, its preset does, every shape has its fields (0 only where a preset has 0);
        the shapes are stored explicitly, in the kernel's field order."""
        from kernels import registry

        try:
            kernel = registry.get(self.kernel)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        if isinstance(self.shapes, str) and self.shapes not in kernel.presets:
            raise ValueError(f"shapes: unknown preset {self.shapes!r}; presets of {self.kernel}: {sorted(kernel.presets)}")
        # A field may be 0 where a preset of the kernel has it 0 (no skew, no top-k, a window layer).
        zero_ok = {f for shapes in kernel.presets.values() for shape in shapes for f, v in shape.items() if v == 0}
        shapes = self.resolved_shapes()
        for i, shape in enumerate(shapes):
            try:
                kernel.shape_key(shape)
            except KeyError as exc:
                raise ValueError(f"shapes[{i}]: {exc.args[0]}") from None
            for field, value in shape.items():
                least = 0 if field in zero_ok else 1
                if not least <= value <= INT64_MAX:
                    raise ValueError(f"shapes[{i}].{field}: every dimension must be >= {least} and < 2**63, got {value}")
        self.shapes = [{f: shape[f] for f in kernel.shape_fields} for shape in shapes]

    def resolved_shapes(self) -> list[dict[str, int]]:
        """The explicit shapes, or the preset's (a spec stored before presets were resolved at validation)."""
        if isinstance(self.shapes, str):
            from kernels import registry

            return [dict(s) for s in registry.get(self.kernel).presets[self.shapes]]
        return self.shapes

    def shape_keys(self) -> list[str]:
        """The shape keys of the sweep's shapes (``kernels.registry.TunableKernel.shape_key``)."""
        if isinstance(self.shapes, str):
            from kernels import registry

            kernel = registry.get(self.kernel)
            return [kernel.shape_key(s) for s in self.resolved_shapes()]
        return [",".join(f"{f}={int(v)}" for f, v in shape.items()) for shape in self.shapes]

    def search_space(self) -> SearchSpace:
        """The kernel's default space with this spec's overrides applied (a stored spec's space was
        checked against the kernels' knobs when it was queued)."""
        return load_space(self.kernel, check_knobs=not self._stored).with_overrides(self.space)

    def trial_budget(self, arch: str) -> int:
        """Configs evaluated per shape: the whole grid, capped by ``budget.max_trials``."""
        grid = self.search_space().size(arch)
        return min(grid, self.budget.max_trials) if self.budget.max_trials else grid

    @property
    def budget_counts_pruned(self) -> bool:
        """An uncapped grid is done when every point was evaluated or pruned."""
        return self.strategy.name == "grid" and not self.budget.max_trials


def format_validation_error(exc: ValidationError) -> str:
    """One ``field.path: reason`` line per problem."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"]) or "<spec>"
        lines.append(f"{path}: {error['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def parse_spec(data: Any, mode: str = "full") -> SweepSpec:
    """A validated spec from already-parsed YAML/JSON data (``mode``: see ``SweepSpec._check``)."""
    if not isinstance(data, dict):
        raise SpecError("<spec>: must be a mapping of fields (kernel, shapes, ...)")
    try:
        return SweepSpec.model_validate(data, context={"mode": mode})
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc)) from None


def stored_spec(data: Any, sweep_id: int) -> SweepSpec:
    """The spec of a stored sweep, read back without the kernel registry (it was validated against the
    kernel when it was queued); :class:`SpecError` naming the sweep when the stored value is corrupt."""
    if not isinstance(data, dict):
        raise SpecError(f"sweep {sweep_id}: its stored spec is {type(data).__name__}, not a mapping (corrupt row)")
    try:
        return SweepSpec.model_validate(data, context={"mode": "stored"})
    except ValidationError as exc:
        raise SpecError(f"sweep {sweep_id}: its stored spec is corrupt:\n{format_validation_error(exc)}") from None


def first_problem(spec: SweepSpec) -> dict[str, Any] | None:
    """The kernel, first shape and input seed of ``spec``'s sweep (the problem its first trial measures, which
    a pool's pre-warmed children can build before its workers exist); None where the shapes are a preset's
    name, which only the kernel modules resolve."""
    if isinstance(spec.shapes, str) or not spec.shapes:
        return None
    return {"kernel": spec.kernel, "shape": dict(spec.shapes[0]), "seed": spec.timing.input_seed}


def read_spec(path: Path) -> dict[str, Any]:
    """The fields of a YAML spec file, checked as far as they can be without the kernel modules (its
    ``early`` checks): what fails here fails before a command starts anything."""
    path = Path(path)
    try:
        if not path.is_file():
            raise SpecError(f"{path}: not a regular file" if path.exists() else f"{path}: no such file")
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply") from None
    spec_of(data, path, "early")
    return data


def spec_of(data: Any, path: Path, mode: str = "full") -> SweepSpec:
    """``parse_spec`` of the data read from ``path``, its errors naming the file."""
    try:
        return parse_spec(data, mode)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None


def load_spec(path: Path) -> SweepSpec:
    """Read and validate a YAML spec file."""
    return spec_of(read_spec(path), path)
