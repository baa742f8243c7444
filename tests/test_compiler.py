"""The ahead-of-time compile: what it reports for a config, and what it leaves to the GPU child."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernels import registry
from workers import compiler


def _kernel(fault: BaseException | None, calls: list[str] | None = None, size: int = 0) -> SimpleNamespace:
    calls = [] if calls is None else calls

    def compile_(inputs: dict, config: dict) -> None:
        calls.append("compile")
        if fault is not None:
            raise fault

    def make_inputs(shape: dict, device: torch.device, seed: int) -> dict:
        calls.append("inputs")
        return {}

    return SimpleNamespace(compile=compile_, shape_key=lambda shape: f"n={shape['n']}", make_inputs=make_inputs,
                           bytes_moved=lambda shape: size)


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


@pytest.mark.parametrize(("size", "compiled"), [(10 << 30, True), (30 << 30, False)])
def test_a_problem_too_large_beside_the_child_is_left_to_it(monkeypatch, size, compiled):
    """On a GPU with 80 GB free, a problem of over a quarter of it is not built here (nor compiled)."""
    calls: list[str] = []
    monkeypatch.setattr(registry, "get", lambda name: _kernel(None, calls, size))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(compiler, "_inputs", {})
    monkeypatch.setattr("kernels.arch.kernel_device", lambda: torch.device("cpu"))
    assert compiler.compile_one("probe", {"n": 3}, {"BLOCK": 3}) == {"status": "ok"}
    assert calls == (["inputs", "compile"] if compiled else [])
