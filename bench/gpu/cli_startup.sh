#!/usr/bin/env bash
# One GPU run for issue 37's one-shot start-up and tables: writes under $OUT
#   startup.json              python -m bench startup: what `tuner sweep run` adds to its sweep, step by step
#   service_vs_autotune.json  python -m bench service_vs_autotune: 144 RMSNorm configs, the command against
#                             @triton.autotune (target: >= 3x faster with the same winner)
#   quickstart_twice.json     `tuner quickstart` run twice into a tables folder holding a copy of the shipped
#                             table: every shipped kernel stays, the new winners replace only their own entries,
#                             and the package's own table is untouched
# plus each step's log and the device. --smoke: the same on the CPU (Triton interpreter, small shapes, no
# autotune comparison), to check the script without a GPU.
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/cli_startup.sh [--smoke]
# QUICKSTART_TWICE=0 leaves the quickstart check out (the start-up figures alone, in half the time).
# Each step has a time limit of its own (exit 124 in its log line), so one stuck step leaves the others theirs.
# From a `git archive` export (no history of its own), set BENCH_COMMIT=<the exported commit> so the
# records name it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/cli-startup}
mkdir -p "$out"
smoke=()
if [[ "${1:-}" == "--smoke" ]]; then
  smoke=(--smoke)
  export TRITON_INTERPRET=1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
# A pip install compiles the packages' bytecode once, at install; the GPU bundle installs without it, so
# the first import of Ray, SQLAlchemy and Optuna on a fresh host would compile it inside the first measured
# command. Compile it here, as pip would have, and the project's own modules as a user's first run leaves them.
site=$(python3 -c "import os, ray; print(os.path.dirname(os.path.dirname(ray.__file__)))")
python3 -m compileall -q -j 0 "$site" . > "$out/compileall.log" 2>&1  # a file that does not compile is skipped, as pip skips it
echo "bytecode compiled under $site and the tree"
status=0

timeout 300 python3 -m bench startup --runs "${STARTUP_RUNS:-3}" "${smoke[@]}" --record "$out/startup.json" > "$out/startup.log" 2>&1
echo "startup: exit $?"; tail -30 "$out/startup.log"
timeout 150 python3 -m bench startup --runs 1 "${smoke[@]}" --with-running-ray --record "$out/startup_joining_ray.json" \
  > "$out/startup_joining_ray.log" 2>&1
echo "startup joining a running Ray: exit $?"; grep -A4 joining "$out/startup_joining_ray.log"

if [[ ${#smoke[@]} -eq 0 ]]; then
  timeout 300 python3 -m bench service_vs_autotune --record "$out/service_vs_autotune.json" > "$out/service_vs_autotune.log" 2>&1
  echo "service_vs_autotune: exit $?"; tail -40 "$out/service_vs_autotune.log"
fi
# the records' headline figures, also in this script's output (where its files may not all come back)
python3 - "$out" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    figures = json.loads(path.read_text())["figures"]
    for row in figures.get("targets", []):
        print(f"{path.stem}: {row['status']}: {row['target']}: {row['measured']}")
    for key in ("pool_start_milestones", "steps"):
        if key in figures:
            print(f"{path.stem} {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures[key].items()))
EOF

[[ "${QUICKSTART_TWICE:-1}" == 0 ]] && exit $status
# quickstart twice: the user tables folder starts as a copy of the shipped table of this arch
export TUNER_TABLES_DIR="$out/tables"
arch=$(python3 -c "from kernels.arch import current_arch; print(current_arch())")
shipped="kernels/tables/$arch.json"
[[ -f "$shipped" ]] || shipped="kernels/tables/sm_90.json"  # the interpreter has no table: sm_90's, renamed
mkdir -p "$TUNER_TABLES_DIR"
python3 - "$shipped" "$TUNER_TABLES_DIR/$arch.json" "$arch" <<'EOF'
import json, sys
table = json.load(open(sys.argv[1]))
table["arch"] = sys.argv[3]
json.dump(table, open(sys.argv[2], "w"), indent=1, sort_keys=True)
EOF
sha256sum kernels/tables/*.json > "$out/shipped_before.sha256"
for run in 1 2; do
  python3 -m tuner.cli --db "sqlite:///$out/quickstart.db" quickstart > "$out/quickstart_$run.log" 2>&1
  echo "quickstart $run: exit $?"; grep -E "^(wrote|queued|sweep)" "$out/quickstart_$run.log"
  cp "$TUNER_TABLES_DIR/$arch.json" "$out/table_after_$run.json"
done
python3 - "$shipped" "$out" "$arch" <<'EOF' || status=1
"""Every shipped kernel and entry stays; an entry changes only where the quickstart's database has a winner."""
import json, subprocess, sys
from pathlib import Path
from sqlalchemy import select
from db import Trial, open_database, session_scope

shipped_path, out, arch = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
shipped = json.loads(shipped_path.read_text())
with session_scope(open_database(f"sqlite:///{out / 'quickstart.db'}")) as session:
    tuned = {(t.kernel, t.shape_key) for t in session.scalars(select(Trial).where(Trial.arch == arch,
                                                                                  Trial.status == "ok"))}
runs = []
for run in (1, 2):
    table = json.loads((out / f"table_after_{run}.json").read_text())
    lost = [(k, s) for k, shapes in shipped["entries"].items() for s in shapes if s not in table["entries"].get(k, {})]
    changed = [(k, s) for k, shapes in shipped["entries"].items() for s, e in shapes.items()
               if s in table["entries"].get(k, {}) and table["entries"][k][s]["config"] != e["config"]]
    runs.append({"run": run, "kernels": len(table["entries"]), "entries": sum(map(len, table["entries"].values())),
                 "lost_entries": lost, "changed_without_a_winner": [c for c in changed if c not in tuned],
                 "changed_by_a_winner": [c for c in changed if c in tuned]})
unchanged = subprocess.run(["sha256sum", "-c", str(out / "shipped_before.sha256")], capture_output=True).returncode == 0
summary = {"arch": arch, "shipped": str(shipped_path), "shipped_kernels": len(shipped["entries"]),
           "shipped_entries": sum(map(len, shipped["entries"].values())), "tuned_pairs": len(tuned), "runs": runs,
           "package_tables_unchanged": unchanged,
           "kept": all(r["kernels"] >= len(shipped["entries"]) and not r["lost_entries"]
                       and not r["changed_without_a_winner"] for r in runs) and unchanged}
(out / "quickstart_twice.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
sys.exit(0 if summary["kept"] else 1)
EOF
echo "quickstart twice: $([[ $status == 0 ]] && echo every shipped entry kept || echo ENTRIES LOST, see quickstart_twice.json)"
exit $status
