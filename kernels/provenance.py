"""What makes two measurements comparable: which tuned table the kernels read, and where they ran."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kernels.arch import current_arch
from kernels.tuning import load_table


def kernel_tables(kernels: str, arch: str | None = None) -> dict[str, Any]:
    """``{"kernels", "arch", "sha256"}``: the tuned table the Triton kernels resolve from (None for eager or no table).

    The hash is of the table as loaded (canonical JSON), so a table copied elsewhere hashes the same.
    ``arch`` defaults to this machine's; the planner asks for the arch of the GPU it plans for.
    """
    if kernels != "triton":
        return {"kernels": kernels, "arch": None, "sha256": None}
    arch = arch or current_arch()
    table = load_table(arch)
    digest = hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest() if table else None
    return {"kernels": kernels, "arch": arch, "sha256": digest}


def tables_key(tables: dict[str, Any]) -> str:
    """One short string for a ``kernel_tables`` dict: ``eager``, ``triton:sm_90:<12 hex>`` or ``triton:interp:none``."""
    if tables["kernels"] != "triton":
        return tables["kernels"]
    return f"triton:{tables['arch']}:{(tables['sha256'] or 'none')[:12]}"
