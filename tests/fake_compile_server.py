"""``workers.compile_server``'s zygote with stand-in compile processes, for the faults a real one seldom shows.

``python -m tests.fake_compile_server POOL_PID CHANNELS``: the child on the i-th channel acts out the i-th
word of ``FAKE_COMPILERS`` (comma-separated): ``die`` (ready, then exits with code 3 on its first request,
after a line that is no answer), ``wait`` (ready, then never answers), ``mute`` (never ready)."""

from __future__ import annotations

import json
import os
import sys
import time

from workers import compile_server


def act(requests_fd: int, answers_fd: int, _problem: object = None) -> None:
    index = next(i for i, pair in enumerate(compile_server.channels_of(sys.argv)) if pair[0] == requests_fd)
    behaviour = os.environ["FAKE_COMPILERS"].split(",")[index]
    answers = os.fdopen(answers_fd, "w", buffering=1)
    if behaviour == "mute":
        time.sleep(60)
    print("a library talking", file=answers)
    print(json.dumps({"ready_at": float(index + 1), "pid": os.getpid()}), file=answers)
    if behaviour == "die":
        os.fdopen(requests_fd).readline()
        os._exit(3)
    time.sleep(60)


if __name__ == "__main__":
    compile_server.serve = act
    compile_server.main(sys.argv)
