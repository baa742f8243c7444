#!/usr/bin/env bash
# One GPU run for issue 36's expert GEMMs: sweep what the shipped sm_90 table lacks (group gemm-untuned: the
# weight-gradient GEMMs first; or SWEEP_GROUP, e.g. expert-backward with FASTEST="expert_up_bwd_dw
# expert_down_bwd_dw expert_down_bwd_dx"; bench/gpu/sweep_group.sh, SWEEP_SECONDS, 0 leaves it out), then time the whole
# expert MLP, forward and forward + backward, against torch._grouped_mm + eager SwiGLU (python -m bench
# expert_mlp): once with the shipped table, once with the swept table laid over it as the user table, so the
# sweep's gain on the MLP is measured in one run. Writes under $OUT:
#   sweep/                      the sweep's database, exported table and logs (sweep_group.sh)
#   expert_mlp.shipped.json     the record with the shipped table
#   expert_mlp.swept.json       the record with the swept table over it (when the sweep exported one)
# plus each step's log. --smoke: the benchmark's small shape on the CPU (Triton interpreter), no sweep, to
# check the script without a GPU.
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/expert_gemms.sh [--smoke]
# From a `git archive` export, set BENCH_COMMIT=<the exported commit> so the records name it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/expert-gemms}
mkdir -p "$out"
bench=(--record)
if [[ "${1:-}" == "--smoke" ]]; then
  export TRITON_INTERPRET=1
  bench=(--smoke --record)
  SWEEP_SECONDS=0
fi
status=0
if [[ "${SWEEP_SECONDS:-200}" != 0 ]]; then
  OUT="$out/sweep" SWEEP_SECONDS="${SWEEP_SECONDS:-200}" bash bench/gpu/sweep_group.sh "${SWEEP_GROUP:-gemm-untuned}"
fi

mlp() {  # mlp NAME: python -m bench expert_mlp into expert_mlp.NAME.json, with its targets echoed
  timeout "${MLP_TIMEOUT:-150}" python3 -m bench expert_mlp "${bench[@]}" "$out/expert_mlp.$1.json" > "$out/expert_mlp.$1.log" 2>&1
  local rc=$?
  echo "expert_mlp, $1 table: exit $rc"
  [[ $rc == 0 ]] || { status=1; tail -20 "$out/expert_mlp.$1.log"; return; }
  python3 - "$out/expert_mlp.$1.json" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["figures"]["targets"]:
    print(f"  {row['status']:<7} {row['target']}: {row['measured']}")
PY
}
mlp shipped
if [[ -f "$out/sweep/sm_90.json" ]]; then
  mkdir -p "$out/tables" && cp "$out/sweep/sm_90.json" "$out/tables/sm_90.json"
  export TUNER_TABLES_DIR="$out/tables"  # the user table, laid over the shipped one
  mlp swept
fi
exit $status
