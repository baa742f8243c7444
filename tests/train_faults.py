"""A Ray worker set-up hook for the training-run tests: an out-of-memory error on the last pipeline stage.

Installed for every worker of the test's Ray session; it acts only in workers that see
``TUNER_TEST_OOM_LAST_STAGE`` (the training runner forwards ``TUNER_*`` variables to its ranks).
"""

from __future__ import annotations

import os


def oom_on_last_stage() -> None:
    if not os.environ.get("TUNER_TEST_OOM_LAST_STAGE"):
        return
    import torch

    from v4.stages import StageModule

    forward = StageModule.forward

    def failing(self, *activations, tokens):
        if self.last:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return forward(self, *activations, tokens=tokens)

    StageModule.forward = failing
