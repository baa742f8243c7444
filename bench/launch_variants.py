"""Which shapes and configs the per-launch diagnostics (``kernel_resources``, ``launch_profile``)
run: a registered launch's preset shapes, and per shape its heuristic default and tuned config,
or named configs laid over the default."""

from __future__ import annotations

from typing import Any

from kernels import registry


def preset_shapes(kernel: registry.TunableKernel, presets: list[str], only: str = "") -> dict[str, dict[str, int]]:
    """The shapes of ``presets`` (each once) whose key contains ``only``, by key."""
    return {kernel.shape_key(s): s for p in presets for s in kernel.presets.get(p, []) if only in kernel.shape_key(s)}


def configs_at(kernel: registry.TunableKernel, shape: dict[str, int], entries: dict[str, Any],
               overrides: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``{"default": ..., "tuned": ...}`` (tuned when the table ``entries`` of the launch have the
    shape), or each of ``overrides`` over the default."""
    default = kernel.default_config(shape)
    if overrides is not None:
        return {variant: {**default, **config} for variant, config in overrides.items()}
    configs = {"default": default}
    entry = entries.get(kernel.shape_key(shape))
    if entry is not None:
        configs["tuned"] = {**default, **entry["config"]}
    return configs
