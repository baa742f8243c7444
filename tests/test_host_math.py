"""Host arithmetic (``kernels.host_math``): the same values as Triton's constexpr functions, and the
kernels' host code calls these, not Triton's (2-3 µs a call on the host against 0.2-0.3;
the indexer's launch made ten)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import triton

from kernels.host_math import cdiv, next_pow2

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


@pytest.mark.parametrize("n", [1, 2, 3, 15, 16, 17, 1000, 4096, 4097, 2**31 - 1])
def test_values_match_triton(n):
    """For positive n (at 0 Triton's next power of two is 0 and ours 1: the callers pass sizes of at
    least 1, or clamp)."""
    assert next_pow2(n) == triton.next_power_of_2(n)
    for d in (1, 3, 16, 128):
        assert cdiv(n, d) == triton.cdiv(n, d)


def _triton_arithmetic_calls(path: Path) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "triton"
                and node.func.attr in ("cdiv", "next_power_of_2")):
            calls.append(f"{path.name}:{node.lineno} triton.{node.func.attr}")
    return calls


def test_kernel_modules_use_the_host_helpers():
    found = [call for path in sorted(KERNELS.glob("*.py")) for call in _triton_arithmetic_calls(path)]
    assert found == [], f"use kernels.host_math on the host: {found}"


def test_the_check_finds_a_call(tmp_path):
    source = tmp_path / "k.py"
    source.write_text("import triton\nn = triton.cdiv(10, 3)\n")
    assert _triton_arithmetic_calls(source) == ["k.py:2 triton.cdiv"]
