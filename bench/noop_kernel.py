"""``service_noop``: a kernel that does nothing, for measuring the sweep service itself (``bench.service_load``).

Its launch returns its input, so a trial costs only what the service spends around it (the
Ray call, the benchmarking child's timing loop, the database writes, the search). It is not
one of the project's kernels: a server runs it only where ``TUNER_KERNEL_MODULES`` names this
module, as ``bench.service_load`` does for the servers it starts; a spec elsewhere that names
it is refused as an unknown kernel.
"""

from __future__ import annotations

import torch

from kernels.registry import TunableKernel, register

NAME = "service_noop"

register(TunableKernel(
    name=NAME,
    shape_fields=("n",),
    exact_fields=(),
    make_inputs=lambda shape, device, seed: {"x": torch.zeros(shape["n"], device=device)},
    run=lambda inputs, config: inputs["x"],
    reference=lambda inputs: inputs["x"],
    default_config=lambda shape: {"VARIANT": 0},
    bytes_moved=lambda shape: 4 * shape["n"],
))
