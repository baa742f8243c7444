"""The TMA descriptor memo (``kernels.descriptor_memo``): an encoding is reused only for the same
address, dtype, device, geometry and kernel metadata, and anything else is encoded afresh.

Triton's CUDA encoder needs a GPU; a counting stand-in takes its place here (the GPU side is
``bench/launch_cache_check.py --switch memo``: parity of launches whose descriptors come from the memo).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import descriptor_memo
from kernels import launch as launch_module  # noqa: F401 - importing it installs the memo on Triton's CUDA driver


class _Encoder:
    """Stands in for ``make_tensordesc_arg``: a fresh list a call, recording its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, arg, metadata, *rest):
        self.calls.append((arg, metadata, rest))
        return [object(), *getattr(arg, "shape", ())]


@pytest.fixture
def memo(monkeypatch):
    monkeypatch.setattr(descriptor_memo, "_memo", {})
    monkeypatch.setattr(descriptor_memo, "hits", 0)
    monkeypatch.setattr(descriptor_memo, "ENABLED", True)
    encoder = _Encoder()
    return encoder, descriptor_memo.memoized(encoder)


META = {"swizzle": 128, "elem_size": 2, "elem_type": 10, "block_size": [64, 128], "fp4_padded": False}


def _desc(t: torch.Tensor, block=(64, 128), padding="zero") -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, list(block), padding)


def test_same_address_and_geometry_reuses_the_encoding(memo):
    encoder, encode = memo
    t = torch.randn(256, 128, dtype=torch.bfloat16)
    first = encode(_desc(t), META)
    again = encode(_desc(t), META)  # a new descriptor object over the same tensor
    assert again is first and len(encoder.calls) == 1 and descriptor_memo.hits == 1
    other = torch.randn(256, 128, dtype=torch.bfloat16)  # t is alive: another address
    assert encode(_desc(other), META) is not first
    assert len(encoder.calls) == 2


def test_every_geometry_field_and_the_metadata_are_keyed(memo):
    encoder, encode = memo
    storage = torch.randn(512, 256, dtype=torch.bfloat16)
    base = storage[:256, :128]
    encode(_desc(base), META)
    variants = [
        _desc(storage[:128, :128]),                                   # shape
        TensorDescriptor(base, [256, 128], [128, 1], [64, 128]),      # strides (same address and shape)
        _desc(base, block=(32, 128)),                                 # block
        _desc(base, padding="nan"),                                   # padding
        _desc(storage.view(torch.float16)[:256, :128]),               # dtype at the same address
    ]
    for variant in variants:
        encode(variant, META)
    encode(_desc(base), dict(META))  # equal metadata of another compiled kernel: keyed by identity
    encode(_desc(base), META, 1)     # a later Triton's extra argument
    assert len(encoder.calls) == 1 + len(variants) + 2 and descriptor_memo.hits == 0


def test_unmemoized_cases_encode_every_time(memo, monkeypatch):
    encoder, encode = memo
    t = torch.randn(64, 128, dtype=torch.bfloat16)
    encode(_desc(t), None)
    encode(_desc(t), None)  # no metadata: Triton passes the tensor itself
    monkeypatch.setattr(descriptor_memo, "ENABLED", False)
    encode(_desc(t), META)
    encode(_desc(t), META)

    @dataclasses.dataclass
    class Unhashable:
        base: torch.Tensor
        options: dict

    encode(Unhashable(t, {"a": 1}), META)
    monkeypatch.setattr(descriptor_memo, "ENABLED", True)
    encode(Unhashable(t, {"a": 1}), META)
    encode(Unhashable(t, {"a": 1}), META)
    assert len(encoder.calls) == 7 and descriptor_memo.hits == 0


def test_a_full_memo_starts_over(memo, monkeypatch):
    encoder, encode = memo
    monkeypatch.setattr(descriptor_memo, "MAX_ENTRIES", 2)
    tensors = [torch.randn(64, 128, dtype=torch.bfloat16) for _ in range(3)]
    for t in tensors:
        encode(_desc(t), META)
    assert len(descriptor_memo._memo) == 1  # cleared on the third, which is kept
    encode(_desc(tensors[2]), META)
    encode(_desc(tensors[0]), META)
    assert len(encoder.calls) == 4 and descriptor_memo.hits == 1


def test_install_wraps_once_and_needs_the_encoder():
    encoder = _Encoder()
    module = types.SimpleNamespace(make_tensordesc_arg=encoder)
    assert descriptor_memo.install(module) and descriptor_memo.install(module)
    assert module.make_tensordesc_arg.encode is encoder
    assert not descriptor_memo.install(types.SimpleNamespace())


def test_importing_kernels_launch_installs_it_on_tritons_cuda_driver():
    from triton.backends.nvidia import driver as cuda_driver

    assert hasattr(cuda_driver.make_tensordesc_arg, "encode")
    assert descriptor_memo.install_on_cuda()
