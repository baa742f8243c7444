"""Integer arithmetic of host code: launch grids, paddings, default tilings, search-space expressions.

Triton's ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions (usable inside
kernels), and on the host each call unwraps its arguments: 2-3 µs a call against 0.2-0.3 for these
(on a CPU). The indexer's launch made seven cdiv calls, 45.7 µs of
its call under cProfile on the H200's host (docs/findings.md, Launches and host time).
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``."""
    return -(-int(a) // int(b))


def next_pow2(n: int) -> int:
    """The least power of two at least ``n`` (1 for ``n <= 1``)."""
    return 1 << max(int(n) - 1, 0).bit_length()
