"""What the project's expert GEMM launches are measured against, on the same inputs.

* ``grouped_mm``: ``torch._grouped_mm`` (CUTLASS grouped GEMM), the GEMM alone, bf16 out;
* ``grouped_mm+epilogue``: the same plus, in eager PyTorch, what the fused kernel does in its
  epilogue (clamped SwiGLU for the up GEMM, the routing weight for the down GEMM);
* ``cublas_loop``: one ``torch.mm`` per expert plus the same eager epilogue, the eager
  PyTorch path a model without grouped kernels takes.

Expert boundaries are read to the host once, before timing (the loop needs them there;
``_grouped_mm`` takes them on the device). A peer the installed torch rejects is reported
with its error instead of a time.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.grouped_gemm import SWIGLU_CLAMP


def peer_swiglu(gu: Tensor) -> Tensor:
    """The clamped SwiGLU of ``gu = [g, u]`` in eager PyTorch, in ``gu``'s dtype: the peers' epilogue."""
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g.clamp(max=SWIGLU_CLAMP)) * u.clamp(-SWIGLU_CLAMP, SWIGLU_CLAMP)


def _loop(a: Tensor, b: Tensor, bounds: list[tuple[int, int]], out_cols: int, transpose_b: bool) -> Tensor:
    """``out[s:e] = a[s:e] @ b[i](^T)`` for each expert i, by one cuBLAS GEMM each."""
    out = a.new_empty(a.shape[0], out_cols)
    for i, (s, e) in enumerate(bounds):
        if e > s:
            torch.mm(a[s:e], b[i].T if transpose_b else b[i], out=out[s:e])
    return out


def _wgrad_loop(a: Tensor, b: Tensor, bounds: list[tuple[int, int]], out: Tensor) -> Tensor:
    """``out[i] = a[s:e]^T @ b[s:e]`` per expert, into a fp32 buffer as the fused kernel writes."""
    for i, (s, e) in enumerate(bounds):
        out[i] = (a[s:e].T @ b[s:e]).float() if e > s else 0.0
    return out


def _plans(name: str, x: dict[str, Tensor], offs: Tensor, bounds: list[tuple[int, int]]
           ) -> dict[str, Callable[[], Any]]:
    gm = torch._grouped_mm
    if name == "expert_up_fwd":
        w13t = x["w13"].transpose(1, 2)  # [E, D, 2F], a view
        return {
            "grouped_mm": lambda: gm(x["x"], w13t, offs=offs),
            "grouped_mm+epilogue": lambda: peer_swiglu(gm(x["x"], w13t, offs=offs)),
            "cublas_loop": lambda: peer_swiglu(_loop(x["x"], x["w13"], bounds, x["w13"].shape[1], True)),
        }
    if name == "expert_down_fwd":
        w2t = x["w2"].transpose(1, 2)  # [E, F, D]
        scale = x["weights"][:, None]
        return {
            "grouped_mm": lambda: gm(x["a"], w2t, offs=offs),
            "grouped_mm+epilogue": lambda: (gm(x["a"], w2t, offs=offs) * scale).to(torch.bfloat16),
            "cublas_loop": lambda: (_loop(x["a"], x["w2"], bounds, x["w2"].shape[1], True) * scale).to(torch.bfloat16),
        }
    if name == "expert_down_bwd_dx":  # the GEMM dy @ W2_e; the fused kernel adds the SwiGLU backward
        return {"grouped_mm": lambda: gm(x["dy"], x["w2"], offs=offs),
                "cublas_loop": lambda: _loop(x["dy"], x["w2"], bounds, x["w2"].shape[2], False)}
    if name == "expert_up_bwd_dx":
        return {"grouped_mm": lambda: gm(x["dgu"], x["w13"], offs=offs),
                "cublas_loop": lambda: _loop(x["dgu"], x["w13"], bounds, x["w13"].shape[2], False)}
    if name in ("expert_up_bwd_dw", "expert_down_bwd_dw"):
        grad_out, lhs, rhs = (("dw13", "dgu", "x") if name == "expert_up_bwd_dw" else ("dw2", "dy", "a"))
        buffer = torch.empty_like(x[grad_out])
        return {"grouped_mm": lambda: gm(x[lhs].T, x[rhs], offs=offs),
                "cublas_loop": lambda: _wgrad_loop(x[lhs], x[rhs], bounds, buffer)}
    return {}


def peers(name: str, inputs: dict[str, Tensor]) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Peer variants of launch ``name`` that run on this torch, and the errors of those that do not."""
    if "offsets" not in inputs:
        return {}, {}
    offsets = inputs["offsets"]
    host = offsets.tolist()
    bounds = list(zip(host[:-1], host[1:]))
    offs = offsets[1:].to(torch.int32).contiguous()
    working, errors = {}, {}
    for variant, fn in _plans(name, inputs, offs, bounds).items():
        try:
            fn()
            torch.cuda.synchronize()
            working[variant] = fn
        except Exception as exc:  # noqa: BLE001 - a peer this torch build does not support
            errors[variant] = f"{type(exc).__name__}: {exc}"[:300]
    return working, errors
