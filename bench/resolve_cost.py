"""Cost of one cached ``kernels.tuning.resolve`` call, the lookup every kernel launch makes.

Times a table hit and a default fallback over many calls (the best of 5 repeats, as
``timeit`` advises) and writes JSON. The table hit reads a copy of the packaged sm_90 table
saved under the running arch's name, so it runs on any machine.
Usage: python bench/resolve_cost.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import timeit
from pathlib import Path
import warnings

from kernels.arch import current_arch
from kernels.tuning import resolve, table_path

CALLS = 200_000
CASES = {"table": ("rmsnorm_fwd", {"tokens": 4096, "hidden": 4096}),
         "default": ("rmsnorm_fwd", {"tokens": 4096, "hidden": 1000})}  # no entry with this hidden size


def main() -> None:
    result = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "calls": CALLS}
    folder = tempfile.mkdtemp()
    table = json.loads(table_path("sm_90").read_text())
    table_path(current_arch(), Path(folder)).write_text(json.dumps(table))
    os.environ["TUNER_TABLES_DIR"] = folder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case, (kernel, shape) in CASES.items():
            result[f"{case}_source"] = resolve(kernel, shape)[1]
            best = min(timeit.repeat(lambda k=kernel, s=shape: resolve(k, s), number=CALLS, repeat=5))
            result[f"{case}_us_per_call"] = best / CALLS * 1e6
    print(json.dumps(result, indent=1))
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
