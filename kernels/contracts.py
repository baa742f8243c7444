"""The input checks the public kernel functions share: what each one refuses, and when.

Every public kernel function states its input contract (dtypes, shapes, index ranges, padding,
contiguity) in its docstring, and refuses an input that would otherwise give a silently wrong
result with a ValueError that names the argument and the reason. Two kinds of check:

* metadata (shapes, dtypes, devices): free, always checked;
* values (index ranges, sorted offsets): they need the tensor's contents, which on a GPU costs a
  wait for the device (a host sync a call, which stalls the launch queue). They run where the
  tensor is on the CPU (the interpreter, the tests: no sync), and on a GPU only with
  ``TUNER_CHECK_KERNEL_INPUTS=1``, a debug flag. Each function says what its kernel does with an
  unchecked value outside its contract.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

CHECK_VALUES_ENV = "TUNER_CHECK_KERNEL_INPUTS"


def values_checked(tensor: Tensor) -> bool:
    """Whether the value checks run on ``tensor``: on the CPU always, on a device under the debug flag."""
    return tensor.device.type == "cpu" or os.environ.get(CHECK_VALUES_ENV, "0") not in ("", "0")


def check_same_device(**tensors: Tensor | None) -> None:
    """ValueError naming the first tensor that is not on the first one's device (None: absent)."""
    present = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = present[0]
    for name, tensor in present[1:]:
        if tensor.device != first.device:
            raise ValueError(f"{name} is on {tensor.device}, {first_name} on {first.device}: "
                             "a kernel's tensors must share one device")


def check_integer(name: str, tensor: Tensor, dtypes: tuple[torch.dtype, ...] = (torch.int32, torch.int64)) -> None:
    """ValueError unless ``tensor`` has one of the integer ``dtypes``."""
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} must be {' or '.join(str(d).removeprefix('torch.') for d in dtypes)}, "
                         f"got {tensor.dtype}")


def check_range(name: str, tensor: Tensor, low: int, high: int, meaning: str) -> None:
    """ValueError unless every value of ``tensor`` lies in ``[low, high)`` (where values are checked);
    ``meaning`` says what the values are, for the message."""
    if tensor.numel() == 0 or not values_checked(tensor):
        return
    bad = (tensor < low) | (tensor >= high)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must hold {meaning} in [{low}, {high - 1}], got {int(tensor[where])} at {list(where)}")
