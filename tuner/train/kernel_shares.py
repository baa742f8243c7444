"""Where a layer's device time goes: its GEMM and attention kernels against everything else.

Issue 36's measure of a layer's eager remainder is the ratio of its forward + backward device time
to the time of its GEMM and attention kernels alone (target: within 1.6x). A profiled round
(``tuner profile layers --trace``) gives every device activity with its duration; each is put in
one class by its name:

* ``gemm``: cuBLAS / CUTLASS (``gemm``, ``nvjet``, ``xmma``, ``cutlass``) and the project's grouped
  expert GEMMs (``_grouped_gemm_kernel``, ``_grouped_wgrad_kernel``);
* ``attention``: the sparse attention (``sparse_attn``), the indexer's scoring (``_score_kernel``)
  and any flash / fused attention;
* ``other``: the rest: the memory-bound kernels, eager elementwise ops, copies, memsets.

Beside them, the share of the layer's timed forward + backward the device was busy at all: a layer
that waits on its host gains nothing from faster kernels (``with_timed_ms``), and the host syncs of
the profiled round with where each was made (``host_syncs``): a sync stops the host from queueing
ahead, so the GPU idles while the host launches what follows it.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

SYNC_WARNING = "synchronizing CUDA operation"  # what torch.cuda.set_sync_debug_mode("warn") says

GEMM_MARKS = ("gemm", "nvjet", "xmma", "cutlass", "_grouped_wgrad_kernel")
ATTENTION_MARKS = ("sparse_attn", "_score_kernel", "flash", "fmha")
TOP_OTHER = 8  # the remainder's largest kernels kept by name in ``kernel_shares.json``
SHORT_NAME_CHARS = 80


def kernel_class(name: str) -> str:
    """``gemm``, ``attention`` or ``other`` for a device activity's name (see the module doc)."""
    lowered = name.lower()
    if any(mark in lowered for mark in ATTENTION_MARKS):
        return "attention"
    if any(mark in lowered for mark in GEMM_MARKS):
        return "gemm"
    return "other"


def short_name(name: str) -> str:
    """A device kernel's name as a reader scans it. Of a C++ signature: no ``void``, namespaces, lambdas'
    scopes or argument list, and template arguments cut after the first that is not a number where they
    run long (``unrolled_elementwise_kernel<CUDAFunctor_add<float>, …>``); profilers give the whole
    demangled signature, often thousands of characters. Other names are only clipped."""
    if not name.startswith("void "):  # not a C++ signature: a Triton kernel, cuBLAS's, a copy, an ``aten::`` op
        return _clip(name)
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "").replace("operator()", "operator")
    text = re.sub(r"\{lambda\([^(){}]*\)#\d+\}", "lambda", text)
    while (scoped := re.sub(r"\w+\([^()]*\)(?: const)?::", "", text)) != text:  # f(args)::lambda, nested
        text = scoped
    text = re.sub(r"\b\w+::", "", text)
    arguments = _top_level(text, "(")
    text = text[:arguments[0]] if arguments else text
    if len(text) <= SHORT_NAME_CHARS or "<" not in text:
        return _clip(text)
    head, _, inside = text.partition("<")
    kept = []
    for argument in _split_top_level(inside.removesuffix(">")):
        kept.append(argument.strip())
        if not argument.strip().isdigit():
            break
    return _clip(f"{head}<{', '.join(kept)}, …>")


def _top_level(text: str, char: str) -> list[int]:
    """Where ``char`` occurs in ``text`` outside any ``<...>``."""
    depth, found = 0, []
    for i, c in enumerate(text):
        depth += {"<": 1, ">": -1}.get(c, 0)
        if c == char and depth == 0:
            found.append(i)
    return found


def _split_top_level(text: str) -> list[str]:
    cuts = [-1, *_top_level(text, ","), len(text)]
    return [text[a + 1:b] for a, b in zip(cuts, cuts[1:])]


def _clip(text: str) -> str:
    return text if len(text) <= SHORT_NAME_CHARS else text[:SHORT_NAME_CHARS - 1] + "…"


def time_shares(activities: Iterable[tuple[str, float]], top: int = TOP_OTHER) -> dict[str, Any]:
    """Milliseconds per class of ``(name, microseconds)`` device activities, their total, the
    remainder ratio (total over GEMM plus attention; None when the layer has neither), and per class
    the ``top`` names by their summed time (``other_top``: what to fuse or remove first; ``gemm_top`` and
    ``attention_top``: which kernels a table changed)."""
    ms = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    by_name: dict[str, Counter] = {kind: Counter() for kind in ms}
    for name, us in activities:
        kind = kernel_class(name)
        ms[kind] += us / 1e3
        by_name[kind][short_name(name)] += us / 1e3
    total = sum(ms.values())
    core = ms["gemm"] + ms["attention"]
    return {**{f"{kind}_ms": round(value, 4) for kind, value in ms.items()}, "total_ms": round(total, 4),
            "total_over_gemm_and_attention": round(total / core, 3) if core else None,
            **{f"{kind}_top": [{"name": name, "ms": round(value, 4)} for name, value in names.most_common(top)]
               for kind, names in by_name.items()}}


def with_timed_ms(shares: dict[str, Any], timed_ms: float) -> dict[str, Any]:
    """``shares`` with the layer's forward + backward as timed without the profiler (CUDA events, from
    the host's first launch to the device's last kernel) and the share of it the device was busy: well
    under one, the layer waits on the host, and faster kernels would not make it faster."""
    busy = shares["total_ms"] / timed_ms if timed_ms > 0 else None
    return {**shares, "timed_ms": round(timed_ms, 4), "device_busy": None if busy is None else round(busy, 3)}


def device_activities(prof: Any) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of every device activity (kernels, copies, memsets) a
    ``torch.profiler.profile`` recorded."""
    from torch.autograd import DeviceType

    return [(event.name, event.time_range.elapsed_us()) for event in prof.events()
            if event.device_type == DeviceType.CUDA]


@contextlib.contextmanager
def host_syncs(on_cuda: bool) -> Iterator[Counter]:
    """Inside ``with``, count the host syncs (``torch.cuda.set_sync_debug_mode``: each one warns) by the
    ``file:line`` of the Python call that made it; nothing is counted off CUDA, where nothing syncs."""
    import torch

    sites: Counter = Counter()
    if not on_cuda:
        yield sites
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if SYNC_WARNING in str(warning.message):
            sites[f"{os.path.relpath(warning.filename)}:{warning.lineno}"] += 1
