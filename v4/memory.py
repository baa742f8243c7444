"""Activation memory as autograd sees it: the bytes of tensors saved for backward.

``SavedActivations`` is a context manager that installs ``saved_tensors_hooks``. Each tensor an op
saves is counted by its storage, once however many ops save it or views of it, and parameters
(and any other tensor given in ``exclude``) are left out. A storage stays "live" until every graph
node that saved it is freed (after its backward, or when the graph is dropped), so the meter
reports both the ``total_bytes`` saved inside the context and the ``peak_bytes`` live at once:
on a pipeline stage, the peak is the activation memory of all microbatches in flight.

What it does not see: tensors an op keeps outside autograd's saved tensors, and the transient
activations of a checkpointed region while it is recomputed during backward (the recompute saves
under torch.utils.checkpoint's own hooks). The inputs a checkpoint keeps are counted.
"""

from __future__ import annotations

import threading
from typing import Iterable

import torch
from torch import Tensor


def _storage_key(t: Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


class _Saved:
    """What autograd holds instead of a saved tensor; releasing it releases the storage's count."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter: SavedActivations, key: tuple[str, int], tensor: Tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedActivations:
    """Counts bytes saved for backward inside ``with``: distinct storages once, ``exclude`` (e.g. parameters) never."""

    def __init__(self, exclude: Iterable[Tensor] = ()):
        self._exclude = {_storage_key(t) for t in exclude}
        self._live: dict[tuple[str, int], list[int]] = {}  # key -> [references, bytes]
        self._lock = threading.Lock()
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self.live_bytes = 0
        self.peak_bytes = 0
        self.total_bytes = 0

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, t: Tensor) -> Tensor | _Saved:
        key = _storage_key(t)
        nbytes = t.untyped_storage().nbytes()
        if key in self._exclude or nbytes == 0:
            return t
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                self._live[key] = [1, nbytes]
                self.live_bytes += nbytes
                self.total_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            else:
                entry[0] += 1
        # detached: holding t itself would tie a saved output to its own graph node (a reference cycle)
        return _Saved(self, key, t.detach())

    @staticmethod
    def _unpack(packed: Tensor | _Saved) -> Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key: tuple[str, int]) -> None:
        with self._lock:
            entry = self._live[key]
            entry[0] -= 1
            if entry[0] == 0:
                del self._live[key]
                self.live_bytes -= entry[1]
