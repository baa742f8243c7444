"""Layer profiles shipped with the package, so that a fresh install plans without a GPU.

The rules, in a few lines:

* one JSON file per GPU kind, ``profiles_data/<kind>.json`` (``h100.json``), written only by
  ``tuner profile export --gpu KIND`` from a profiles database, never by hand;
* a file holds, per (model, seq, mbs, ep, kernel path), the newest row of every layer kind with
  its provenance: the device it ran on, the toolchain, the kernel-table key (``triton:sm_90:<12
  hex>``, a digest of the tuned table), when it was measured and the command that measured it;
  and the EP all-to-all when one was measured (``null`` otherwise: the planner then says it is
  not priced);
* the planner reads the database first; this file only when the database has no rows for the
  GPU kind at that key (``profiles.load_costs``), and every output names which one it used;
* the same database gives the same bytes (sorted keys, the rows' own dates), so re-running the
  export shows in ``git diff`` only what was re-measured.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from db import session_scope
from db.planning import AlltoallProfile, LayerProfile

PACKAGED_PROFILES = Path(__file__).parent / "profiles_data"
FORMAT = 1
ROW_FIELDS = ("forward_ms", "backward_ms", "recompute_backward_ms", "activation_bytes", "recompute_kept_bytes",
              "selective_kept_bytes", "params", "expert_params", "optimizer_ms_per_param", "p2p_bytes")
ALLTOALL_FIELDS = ("rows_per_rank", "hidden", "bytes_per_rank", "dispatch_ms", "combine_ms", "alltoall_ms", "gbps",
                   "reps")


class NothingToExport(LookupError):
    """The database has no profile rows of the GPU kind asked for."""


@dataclass(frozen=True)
class PackagedProfile:
    """The shipped rows of one (model, seq, mbs, ep, kernel path) and where they came from.

    The rows are the database's row classes, built in memory (never added to a session, id
    None), so the loader reads a shipped row exactly as a stored one.
    """

    kind: str
    rows: dict[str, LayerProfile]
    alltoall: AlltoallProfile | None
    provenance: dict[str, Any]

    def describe(self) -> str:
        """One line for the plan output: the file, the device, the tables, the toolchain, the date."""
        p = self.provenance
        tools = ", ".join(f"{k} {p['toolchain'][k]}" for k in ("torch", "triton", "cuda", "hip")
                          if p["toolchain"].get(k))
        return (f"packaged {self.kind} profiles (profiles_data/{self.kind}.json): measured {p['measured_at'][:10]} on "
                f"{p['device']} with {p['kernel_tables']} ({tools}) by `{p['command']}`")


def profile_command(model: str, seq: int, mbs: int, ep: int, kernel_tables: str) -> str:
    """The ``tuner profile layers`` command that measures rows with this key."""
    kernels = kernel_tables.partition(":")[0]
    return f"tuner profile layers --model {model} --seq {seq} --mbs {mbs} --ep {ep} --kernels {kernels}"


def _row_dict(row: LayerProfile) -> dict[str, Any]:
    return {name: getattr(row, name) for name in ROW_FIELDS}


def export_profiles(engine: Engine, kind: str, device_name: str, out: Path) -> Path:
    """Write ``out/<kind>.json`` from the newest rows of ``device_name`` in the database; returns the path.

    Per (model, seq, mbs, ep, kernel path) the newest row of each layer kind, with the all-to-all
    of that key when measured. Written atomically (a temporary file renamed over the old one).
    Raises NothingToExport when the database has no row of that device.
    """
    with session_scope(engine) as session:
        rows = session.scalars(select(LayerProfile).filter_by(gpu_kind=device_name)
                               .order_by(LayerProfile.created_at, LayerProfile.id)).all()
        alltoalls = {(a.model, a.seq, a.mbs, a.ep): a for a in
                     session.scalars(select(AlltoallProfile).filter_by(gpu_kind=device_name)).all()}
        if not rows:
            raise NothingToExport(f"no layer profiles of {device_name!r} ({kind}) in the database; measure them "
                                  f"with `tuner profile layers` on that GPU")
        groups: dict[tuple, dict[str, LayerProfile]] = {}
        for row in rows:  # later rows win
            key = (row.model, row.seq, row.mbs, row.ep, row.kernel_tables.partition(":")[0])
            groups.setdefault(key, {})[row.layer_kind] = row
        profiles = []
        for (model, seq, mbs, ep, _), by_kind in sorted(groups.items()):
            newest = max(by_kind.values(), key=lambda r: (r.created_at, r.id))
            tables = sorted({r.kernel_tables for r in by_kind.values()})
            alltoall = alltoalls.get((model, seq, mbs, ep))
            profiles.append({
                "model": model, "seq": seq, "mbs": mbs, "ep": ep,
                "provenance": {"device": device_name, "gpu_memory_bytes": newest.gpu_memory_bytes,
                               "toolchain": newest.toolchain or {}, "kernel_tables": "+".join(tables),
                               "measured_at": newest.created_at.isoformat(),
                               "command": profile_command(model, seq, mbs, ep, newest.kernel_tables)},
                "layers": {k: {**_row_dict(r), "kernel_tables": r.kernel_tables,
                               "measured_at": r.created_at.isoformat()} for k, r in sorted(by_kind.items())},
                "alltoall": None if alltoall is None else {
                    **{n: getattr(alltoall, n) for n in ALLTOALL_FIELDS}, "toolchain": alltoall.toolchain or {},
                    "measured_at": alltoall.created_at.isoformat()},
            })
    data = {"format": FORMAT, "gpu": kind, "device_name": device_name,
            "exported_by": f"tuner profile export --gpu {kind}", "profiles": profiles}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{kind}.json"
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{kind}.", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a package file is world-readable
    os.replace(tmp, path)
    return path


@functools.lru_cache(maxsize=16)
def _file(kind: str, folder: Path) -> dict[str, Any] | None:
    path = folder / f"{kind}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def packaged_kinds(folder: Path | None = None) -> list[str]:
    """The GPU kinds with shipped profiles (in ``folder``, default the package's)."""
    return sorted(p.stem for p in (folder or PACKAGED_PROFILES).glob("*.json"))


def packaged_profile(kind: str, model: str, seq: int, mbs: int, ep: int, kernels: str,
                     folder: Path | None = None) -> PackagedProfile | None:
    """The shipped rows of ``kind`` at the key on kernel path ``kernels`` (``triton`` / ``eager``), or None;
    ``folder`` defaults to the package's."""
    data = _file(kind, folder or PACKAGED_PROFILES)
    if data is None:
        return None
    for entry in data["profiles"]:
        if (entry["model"], entry["seq"], entry["mbs"], entry["ep"]) != (model, seq, mbs, ep):
            continue
        layers = entry["layers"]
        if not layers or next(iter(layers.values()))["kernel_tables"].partition(":")[0] != kernels:
            continue
        memory = entry["provenance"]["gpu_memory_bytes"]
        rows = {k: LayerProfile(layer_kind=k, **{n: v[n] for n in ROW_FIELDS}, kernel_tables=v["kernel_tables"],
                                created_at=datetime.fromisoformat(v["measured_at"]), gpu_memory_bytes=memory,
                                gpu_kind=entry["provenance"]["device"], model=model, seq=seq, mbs=mbs, ep=ep)
                for k, v in layers.items()}
        a = entry["alltoall"]
        alltoall = None if a is None else AlltoallProfile(
            **{n: a[n] for n in ALLTOALL_FIELDS}, created_at=datetime.fromisoformat(a["measured_at"]),
            gpu_kind=entry["provenance"]["device"], model=model, seq=seq, mbs=mbs, ep=ep)
        return PackagedProfile(kind, rows, alltoall, entry["provenance"])
    return None
