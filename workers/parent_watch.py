"""A child process that ends with its parent: a benchmarking child, pre-warmed or not, must not keep
its GPU busy for nobody after its worker (or the pool that started it) is gone."""

from __future__ import annotations

import os
import threading
import time

PARENT_CHECK_S = 0.5


def exit_with_parent(parent: int | None = None) -> None:
    """End this process, from a daemon thread, once its parent is gone (it is then re-parented).

    ``parent``: the pid the parent had when it started this process, where it may have died before
    this call (the default, this process's parent now, would then be the process that adopted it)."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
