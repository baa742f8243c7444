"""kernels.launch's compiled-kernel cache: what it keys a launch on, and that a cached launch calls the
compiled launcher with the arguments ``JITFunction.run`` would. The launcher itself runs only on a GPU
(the H200 parity runs go through it); here Triton's side is stood in for."""

from __future__ import annotations

import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import _allocation
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import launch as launch_module


def _kernel_body(x_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    pass


def _interleaved_body(x_ptr, BLOCK: tl.constexpr, n):
    pass


class _Compiled:
    """A stand-in for Triton's CompiledKernel: records what its launcher is called with."""

    def __init__(self):
        self.calls = []
        self.function, self.packed_metadata = "function", "metadata"

    @property
    def run(self):
        return lambda *launch_args: self.calls.append(launch_args)


@pytest.fixture
def gpu_like(monkeypatch):
    """A real JITFunction whose ``run`` (compile and launch) is recorded, on a pretend sm_90."""
    kernel = JITFunction(_kernel_body)
    compiled, runs = _Compiled(), []
    kernel.run = lambda *args, grid, warmup, **options: runs.append((args, grid, options)) or compiled
    monkeypatch.setattr(launch_module, "current_arch", lambda: "sm_90")
    monkeypatch.setattr(launch_module, "driver", type("Driver", (), {"active": _ActiveDriver()}))
    monkeypatch.setattr(launch_module, "_compiled", {})
    return kernel, compiled, runs


class _ActiveDriver:
    @staticmethod
    def get_current_device():
        return 0

    @staticmethod
    def get_current_stream(device):
        return 1234


def _launch(kernel, x, n, flag=True):
    launch_module.launch(kernel, (3, 2), (x, n, 0.5), {"BLOCK": 64, "FLAG": flag}, {"num_warps": 4, "num_stages": 2})


def test_a_seen_launch_calls_the_compiled_launcher_with_every_parameter(gpu_like):
    kernel, compiled, runs = gpu_like
    x = torch.zeros(64)
    _launch(kernel, x, 32)
    assert len(runs) == 1 and not compiled.calls
    _launch(kernel, x, 48)  # the same specialization: 48 is a multiple of 16 too
    assert len(runs) == 1
    (call,) = compiled.calls
    assert call[:9] == (3, 2, 1, 1234, "function", "metadata", None, None, None)
    assert call[9:] == (x, 48, 0.5, 64, True)


@pytest.mark.parametrize("change", ["dtype", "misaligned", "int_one", "int_not_16", "constexpr", "option"])
def test_what_triton_specializes_on_misses_the_cache(gpu_like, change):
    kernel, compiled, runs = gpu_like
    x = torch.zeros(64)
    _launch(kernel, x, 32)
    if change == "dtype":
        _launch(kernel, x.double(), 32)
    elif change == "misaligned":
        _launch(kernel, x[1:], 32)
    elif change == "int_one":
        _launch(kernel, x, 1)
    elif change == "int_not_16":
        _launch(kernel, x, 33)
    elif change == "constexpr":
        _launch(kernel, x, 32, flag=False)
    else:
        launch_module.launch(kernel, (3, 2), (x, 32, 0.5), {"BLOCK": 64, "FLAG": True}, {"num_warps": 8})
    assert len(runs) == 2 and not compiled.calls


def test_tma_descriptors_are_keyed_on_dtype_and_block_shape(gpu_like):
    """Triton 3.6 specializes a host-built descriptor on its dtype and block shape only; its launcher
    reads the base, shape, strides and padding at each launch, so those may differ in a cached one."""
    kernel, compiled, runs = gpu_like
    x, y = torch.zeros(64, 64), torch.zeros(128, 32)

    def launch_desc(desc):
        launch_module.launch(kernel, (1,), (desc, 32, 0.5), {"BLOCK": 64, "FLAG": True}, {})

    launch_desc(TensorDescriptor.from_tensor(x, [16, 16]))
    other = TensorDescriptor(y, [100, 32], [32, 1], [16, 16], padding="nan")
    launch_desc(other)  # another tensor, shape and padding: the same compiled kernel
    assert len(runs) == 1 and compiled.calls[0][9] is other
    launch_desc(TensorDescriptor.from_tensor(x, [16, 32]))  # another block shape
    launch_desc(TensorDescriptor.from_tensor(x.double(), [16, 16]))  # another dtype
    assert len(runs) == 3 and len(compiled.calls) == 1


def test_launches_it_cannot_key_go_through_triton(gpu_like, monkeypatch):
    kernel, compiled, runs = gpu_like
    x = torch.zeros(64)
    launch_module.launch(kernel, (1,), (x, object(), 0.5), {"BLOCK": 64, "FLAG": True}, {})  # an unkeyable argument
    launch_module.launch(kernel, (1,), (x, object(), 0.5), {"BLOCK": 64, "FLAG": True}, {})
    monkeypatch.setattr(launch_module, "CACHE_COMPILED", False)
    _launch(kernel, x, 32)
    _launch(kernel, x, 32)
    assert len(runs) == 4 and not compiled.calls


def test_an_unhashable_constexpr_goes_through_triton(gpu_like):
    kernel, compiled, runs = gpu_like
    x = torch.zeros(64)
    for _ in range(2):
        launch_module.launch(kernel, (1,), (x, 32, 0.5), {"BLOCK": 64, "FLAG": [1, 2]}, {})
    assert len(runs) == 2 and not compiled.calls and not launch_module._compiled


def test_a_set_launch_hook_turns_the_cache_off(gpu_like, monkeypatch):
    kernel, compiled, runs = gpu_like
    monkeypatch.setattr(launch_module, "_hook_idle", lambda hook: False)
    x = torch.zeros(64)
    _launch(kernel, x, 32)
    _launch(kernel, x, 32)
    assert len(runs) == 2 and not compiled.calls


def test_only_kernels_whose_constexprs_come_last_are_cached():
    assert launch_module._trailing_constexprs(JITFunction(_kernel_body), 3) == ("BLOCK", "FLAG")
    assert launch_module._trailing_constexprs(JITFunction(_kernel_body), 2) is None
    assert launch_module._trailing_constexprs(JITFunction(_interleaved_body), 2) is None


def test_the_interpreter_is_never_cached(monkeypatch):
    monkeypatch.setattr(launch_module, "current_arch", lambda: launch_module.INTERPRETER_ARCH)
    kernel = JITFunction(_kernel_body)
    assert launch_module._launch_key(kernel, (torch.zeros(4), 3, 0.5), {"BLOCK": 4}, ()) is None


def _in_a_new_thread(body):
    """``body()``'s result, run in a thread of its own (which starts without Triton's allocator, as
    autograd's backward threads do)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(body()))
    thread.start()
    thread.join()
    return result[0]


def test_the_scratch_allocator_is_set_in_each_launching_thread_unless_it_has_one():
    def fresh_thread():
        before = _allocation._allocator.get()
        launch_module.ensure_scratch_allocator()
        return before, _allocation._allocator.get()

    before, after = _in_a_new_thread(fresh_thread)
    assert isinstance(before, _allocation.NullAllocator) and after is launch_module._torch_scratch

    def own_allocator():
        def mine(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)
        triton.set_allocator(mine)
        launch_module.ensure_scratch_allocator()
        return _allocation._allocator.get() is mine

    assert _in_a_new_thread(own_allocator)

