"""A profiled layer's device time split into GEMMs, attention and the rest, by kernel name."""

import os
import sys
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from tuner.train.kernel_shares import (SHORT_NAME_CHARS, device_activities, host_syncs, kernel_class, short_name,
                                       time_shares, with_timed_ms)


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
    ("_grouped_gemm_kernel", "gemm"),
    ("_grouped_wgrad_kernel", "gemm"),
    ("_sparse_attn_bwd_kernel", "attention"),
    ("_sparse_attn_fwd_sm90_persistent_kernel", "attention"),
    ("_score_kernel", "attention"),
    ("void at::native::(anonymous namespace)::indexFuncLargeIndex<c10::BFloat16, long>", "other"),
    ("Memcpy DtoD (Device -> Device)", "other"),
    ("_combine_kernel", "other"),
])
def test_kernel_class_by_name(name, kind):
    assert kernel_class(name) == kind


def test_time_shares_sum_by_class_and_give_the_remainder_ratio():
    shares = time_shares([("nvjet_a", 600.0), ("_sparse_attn_fwd_kernel", 400.0), ("elementwise", 500.0)])
    assert shares == {"gemm_ms": 0.6, "attention_ms": 0.4, "other_ms": 0.5, "total_ms": 1.5,
                      "total_over_gemm_and_attention": 1.5, "other_top": [{"name": "elementwise", "ms": 0.5}],
                      "gemm_top": [{"name": "nvjet_a", "ms": 0.6}],
                      "attention_top": [{"name": "_sparse_attn_fwd_kernel", "ms": 0.4}]}
    assert time_shares([("elementwise", 10.0)])["total_over_gemm_and_attention"] is None


def test_each_class_is_named_by_its_largest_kernels_summed_over_their_calls():
    activities = [("copy", 100.0), ("nvjet_a", 900.0), ("index_add", 300.0), ("copy", 250.0), ("fill", 50.0),
                  ("_grouped_wgrad_kernel", 400.0), ("_grouped_wgrad_kernel", 600.0), ("_grouped_gemm_kernel", 200.0)]
    shares = time_shares(activities, top=2)
    assert shares["other_top"] == [{"name": "copy", "ms": 0.35}, {"name": "index_add", "ms": 0.3}]
    assert shares["gemm_top"] == [{"name": "_grouped_wgrad_kernel", "ms": 1.0}, {"name": "nvjet_a", "ms": 0.9}]


COPY_LAMBDA = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
               "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}"
               "::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::"
               "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
               "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, "
               "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
               "::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>"
               "(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
               "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} "
               "const&)::{lambda(int)#1})")


@pytest.mark.parametrize("name, short", [
    ("_grouped_gemm_kernel", "_grouped_gemm_kernel"),
    ("aten::index_add_", "aten::index_add_"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("void at::native::(anonymous namespace)::sum_and_scatter<c10::BFloat16, long>(long const*, c10::BFloat16*)",
     "sum_and_scatter<BFloat16, long>"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>, 4, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::"
     "LoadWithCast<2>, at::native::memory::StoreWithCast<1> >(int, at::native::CUDAFunctor_add<float>)",
     "unrolled_elementwise_kernel<CUDAFunctor_add<float>, …>"),
])
def test_short_names_drop_namespaces_arguments_and_long_template_tails(name, short):
    assert short_name(name) == short


def test_a_long_lambda_signature_shortens_to_a_readable_line():
    short = short_name(COPY_LAMBDA)
    assert short.startswith("elementwise_kernel<128, 4, gpu_kernel_impl_nocast<lambda>")
    assert len(short) <= SHORT_NAME_CHARS and "::" not in short
    shares = time_shares([(COPY_LAMBDA, 100.0), (COPY_LAMBDA, 50.0)])
    assert shares["other_top"] == [{"name": short, "ms": 0.15}]


def test_device_activities_keep_only_device_events():
    def event(name, device_type, us):
        return SimpleNamespace(name=name, device_type=device_type,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))
    prof = SimpleNamespace(events=lambda: [event("aten::mm", DeviceType.CPU, 900.0),
                                           event("nvjet_a", DeviceType.CUDA, 120.0)])
    assert device_activities(prof) == [("nvjet_a", 120.0)]


def test_the_device_busy_share_is_the_kernels_time_over_the_timed_layer():
    shares = time_shares([("nvjet_a", 3000.0), ("_sparse_attn_fwd_kernel", 1000.0), ("elementwise", 3500.0)])
    timed = with_timed_ms(shares, 22.5)  # window/hash on one H100: 7.5 ms of kernels in a 22.5 ms layer
    assert timed["timed_ms"] == 22.5 and timed["device_busy"] == 0.333
    assert with_timed_ms(shares, 0.0)["device_busy"] is None


def test_host_syncs_are_counted_by_the_line_that_made_them(monkeypatch):
    """On CUDA the sync debug mode turns each sync into a warning; the count keeps the caller's line,
    ignores other warnings and leaves the mode as it found it. Off CUDA nothing is set or counted."""
    import warnings

    import torch

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def sync() -> None:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)

    with host_syncs(True) as sites:
        line = sys._getframe().f_lineno + 2
        for _ in range(2):
            sync()
        warnings.warn("something else", UserWarning)
    assert modes == ["warn", "default"]
    assert sites == {f"{os.path.relpath(__file__)}:{line}": 2}
    with host_syncs(False) as none:
        sync()
    assert modes == ["warn", "default"] and none == {}
