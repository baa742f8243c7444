"""Host µs a call of Triton's ``triton.cdiv`` / ``triton.next_power_of_2`` (constexpr functions) against
``kernels.host_math``'s plain ones, on this machine's CPU: why the kernels' host code uses the latter.

Usage: python bench/host_arith_cost.py OUT_JSON
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

import triton

from kernels.host_math import cdiv, next_pow2

CALLS = 100_000


def _us(fn) -> float:
    return min(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6


def main() -> None:
    row = {"triton_cdiv_us": _us(lambda: triton.cdiv(4096, 64)), "host_cdiv_us": _us(lambda: cdiv(4096, 64)),
           "triton_next_power_of_2_us": _us(lambda: triton.next_power_of_2(4000)),
           "host_next_pow2_us": _us(lambda: next_pow2(4000)), "triton": triton.__version__}
    print(json.dumps(row))
    Path(sys.argv[1]).write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
