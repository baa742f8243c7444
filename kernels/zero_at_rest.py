"""Zero-at-rest scratch: an fp32 accumulator and int32 arrival counters that are zero whenever no
launch is using them, for kernels whose programs add into one sum and whose last program to
arrive publishes it and zeroes the scratch again.

Why: such a sum otherwise needs a buffer zeroed before every launch, a fill launch of its own
(the compressor backward's dape: 0.7 us of kernel time, and a graph node, for 4-16 KB).
Zeroed once at allocation, and re-zeroed by the launch that used it, the scratch
needs none.

Each device keeps ``SLOTS`` of them, allocated together on the first request and never freed
(a captured CUDA graph may hold their addresses), handed out in turn. Launches on one stream run
one after another, so they may share a slot; launches on different streams share one only if
``SLOTS`` launches have been handed out in between while the first still runs. A request larger
than the slots, or made in a graph capture before any slot exists, gets scratch of its own,
zeroed by a fill (inside the graph, when capturing).

``last_to_arrive`` is the device side: a program counts its arrival and learns whether it is the
last, which then sees every other program's writes (the split-K semaphore pattern).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SLOTS = 16
SLOT_FLOATS = 1 << 16  # an HCA dape, [128, 512]
SLOT_COUNTERS = 1 << 10

_slots: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
_turn: dict[torch.device, int] = {}


def take(device: torch.device, floats: int, counters: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(slot, accumulator, counters)`` of at least ``floats`` fp32 and ``counters`` int32, all
    zero; ``slot`` is -1 for scratch of its own. The launch that takes a slot must leave it zero."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if device not in _slots and not capturing:
        _slots[device] = [(torch.zeros(max(floats, SLOT_FLOATS), dtype=torch.float32, device=device),
                           torch.zeros(max(counters, SLOT_COUNTERS), dtype=torch.int32, device=device))
                          for _ in range(SLOTS)]
    if device in _slots:
        slot = _turn.get(device, 0)
        _turn[device] = (slot + 1) % SLOTS
        acc, arrivals = _slots[device][slot]
        if acc.numel() >= floats and arrivals.numel() >= counters:
            return slot, acc, arrivals
    return (-1, torch.zeros(floats, dtype=torch.float32, device=device),
            torch.zeros(counters, dtype=torch.int32, device=device))


@triton.jit
def last_to_arrive(arrivals_ptr, index, programs):
    """Count this program's arrival at counter ``index``; whether it is the last of ``programs``. Every
    thread's writes come before the release, and the last arrival reads the others' after its acquire."""
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + index, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    return arrived == programs - 1


def restore(device: torch.device, slot: int) -> None:
    """Zero ``slot`` again (a fill, after whatever the stream runs before it): a launch that used it
    did not finish (a kernel interrupted under the CPU interpreter), so it may not be zero."""
    if slot >= 0:
        for tensor in _slots[device][slot]:
            tensor.zero_()
