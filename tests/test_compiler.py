"""The ahead-of-time compile: what it reports for a config, and what it leaves to the GPU child."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernels import registry
from workers import compiler


def _kernel(fault: BaseException | None) -> SimpleNamespace:
    def compile_(inputs: dict, config: dict) -> None:
        if fault is not None:
            raise fault

    return SimpleNamespace(compile=compile_, shape_key=lambda shape: f"n={shape['n']}",
                           make_inputs=lambda shape, device, seed: {})


@pytest.mark.parametrize(("fault", "status"), [
    (None, "ok"),
    # A GPU filled by other processes says nothing about the config: the child compiles it.
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 10.00 GiB"), "ok"),
    (ValueError("BLOCK must be a power of two"), "compile_error"),
])
def test_compile_reports_the_configs_own_failures_only(monkeypatch, fault, status):
    monkeypatch.setattr(registry, "get", lambda name: _kernel(fault))
    compiler._inputs.clear()
    result = compiler.compile_one("probe", {"n": 3}, {"BLOCK": 3})
    assert result["status"] == status
    if status == "compile_error":
        assert "BLOCK must be a power of two" in result["error"]
