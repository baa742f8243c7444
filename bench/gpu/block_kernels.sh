#!/usr/bin/env bash
# One GPU run for issue 36's block-kernel geomean: sweep a group of bench/sweep_specs.py (default
# gemm-untuned: the expert GEMMs' shapes the shipped sm_90 table lacks, the smallest first; SWEEP_SECONDS, 0 leaves the sweep
# out; bench/gpu/sweep_group.sh), then time every block-kernel cell, the expert GEMMs and the memory-bound
# launches at the Flash and Pro shapes, the heuristic default against the table's config, with the swept
# table laid over the shipped one as the user table (python -m bench kernels_vs_peers --kernels gemm,memory
# --no-peers). Writes under $OUT:
#   sweep/                     the sweep's database, exported table and logs (sweep_group.sh)
#   kernels_vs_peers.json      the record (kernels_vs_peers.json.partial holds the cells done, while it runs)
#   kernels_vs_peers.log
# The Flash EP 1 weight-gradient cells hold about 70 GB: an H100 names them among the cells not measured
# (a cell without a table config counts at 1.00x in the geomean all the same; a tuned one leaves it incomplete).
# Usage (GPU host, bundle carried): source .gpubundle/install.sh && bash bench/gpu/block_kernels.sh
# From a `git archive` export, set BENCH_COMMIT=<the exported commit> so the record names it (bench/record.py).
set -uo pipefail
out=${OUT:-/tmp/block-kernels}
mkdir -p "$out"
if [[ "${SWEEP_SECONDS:-200}" != 0 ]]; then
  OUT="$out/sweep" SWEEP_SECONDS="${SWEEP_SECONDS:-200}" bash bench/gpu/sweep_group.sh "${SWEEP_GROUP:-gemm-untuned}"
fi
if [[ -f "$out/sweep/sm_90.json" ]]; then
  mkdir -p "$out/tables" && cp "$out/sweep/sm_90.json" "$out/tables/sm_90.json"
  export TUNER_TABLES_DIR="$out/tables"  # the user table, laid over the shipped one
fi
timeout "${BENCH_TIMEOUT:-330}" python3 -m bench kernels_vs_peers --kernels gemm,memory --no-peers \
  --record "$out/kernels_vs_peers.json" > "$out/kernels_vs_peers.log" 2>&1
status=$?
echo "kernels_vs_peers: exit $status (124: stopped at its time limit; the .partial record holds the cells done)"
python3 - "$out" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in (out / "kernels_vs_peers.json", out / "kernels_vs_peers.json.partial"):
    if path.exists():
        figures = json.loads(path.read_text())["figures"]
        missing = figures["cells not measured"]  # "none", or one line per cell (a partial record: every cell not reached)
        print(f"{path.name}: {figures['cells']} cells measured; not measured: "
              f"{missing if missing == 'none' else f'{len(missing)}, the first: {missing[0]}'}; "
              f"parity failures: {figures['parity failures']}")
        for row in figures["targets"]:
            print(f"  {row['status']:<10} {row['target']}: {row['measured']}")
        break
EOF
exit $status
