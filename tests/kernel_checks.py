"""Checks every tunable kernel must pass, shared by the per-kernel test files."""

from __future__ import annotations

from typing import Any

import torch

from kernels import registry, tuning
from kernels.arch import INTERPRETER_ARCH, current_arch, kernel_device
from kernels.registry import TunableKernel
from search_spaces import load_space
from workers.bench_child import as_tuple

DEVICE = kernel_device()


def assert_config_matches_reference(kernel: TunableKernel, config: dict[str, Any], seed: int,
                                    shapes: list[dict[str, int]] | None = None) -> None:
    """``config`` computes the reference at every one of ``shapes`` (default: the small presets)
    that its space allows on this arch.

    The interpreter allows every config; on a GPU a config the space prunes (e.g. more
    shared memory than the chip has) is skipped, as a sweep would skip it. A config the space
    allows at none of the shapes, here or on the interpreter, would test nothing, so it fails.
    """
    space = load_space(kernel.name)
    shapes = kernel.presets["small"] if shapes is None else shapes
    allowed = [s for s in shapes for arch in {current_arch(), INTERPRETER_ARCH}
               if space.violation(config, s, arch) is None]
    assert allowed, (f"{kernel.name}: the space allows {config} at none of {shapes} "
                     f"({space.violation(config, shapes[0], current_arch())}): it would test nothing")
    for shape in shapes:
        if space.violation(config, shape, current_arch()):
            continue
        inputs = kernel.make_inputs(shape, DEVICE, seed=seed)
        outputs, expected = as_tuple(kernel.run(inputs, config)), as_tuple(kernel.reference(inputs))
        assert len(outputs) == len(expected)
        for out, ref in zip(outputs, expected):
            assert out.shape == ref.shape and out.dtype == ref.dtype
            if out.is_floating_point():
                out, ref = out.float(), ref.float()
            torch.testing.assert_close(out, ref, atol=kernel.atol, rtol=kernel.rtol)


def assert_seeded_random_inputs(kernel: TunableKernel, shape: dict[str, int], integers_nonzero: bool = True,
                                fixed: tuple[str, ...] = ()) -> None:
    """Inputs repeat for a seed, change with it (except the ``fixed`` ones, which the shape may
    pin down), hold no zeros; the default config compiles."""
    first, again, other = (kernel.make_inputs(shape, DEVICE, seed) for seed in (5, 5, 6))
    assert first.keys() == again.keys() == other.keys()
    for key in first:
        if not isinstance(first[key], torch.Tensor):  # a constant of the shape, e.g. topk
            assert first[key] == again[key] == other[key]
            continue
        assert torch.equal(first[key], again[key])
        assert key in fixed or not torch.equal(first[key], other[key])
        if integers_nonzero or first[key].is_floating_point():
            assert torch.count_nonzero(first[key]) == first[key].numel()
    assert kernel.compile(first, kernel.default_config(shape)) is None


def spy_on_resolve(monkeypatch: Any, module: Any) -> list[tuple[str, str]]:
    """(kernel, shape key) of every launch-parameter lookup ``module`` makes from now on, in order;
    the lookups still go to ``kernels.tuning.resolve``."""
    asked: list[tuple[str, str]] = []

    def spy(kernel: str, shape: dict[str, int]) -> Any:
        asked.append((kernel, registry.get(kernel).shape_key(shape)))
        return tuning.resolve(kernel, shape)

    monkeypatch.setattr(module, "resolve", spy)
    return asked


def assert_defaults_fit_space(name: str, presets: tuple[str, ...] | None = None, grid_points: bool = False) -> None:
    """The heuristic default of every shape of ``presets`` (all of the kernel's when None) passes the
    kernel's sm_90 constraints; with ``grid_points`` it is also a point of the space's grid (``maxnreg``
    left to the compiler), so a sweep can measure it."""
    kernel, space = registry.get(name), load_space(name)
    shapes = [s for preset, group in kernel.presets.items() if presets is None or preset in presets for s in group]
    for shape in shapes:
        config = kernel.default_config(shape)
        if grid_points:
            config = {**config, "maxnreg": None}
            assert all(config[p] in choices for p, choices in space.dimensions("sm_90").items()), config
        assert space.violation(config, shape, "sm_90") is None, (shape, config)
