# Sourced by the offline sm_90 scripts that follow bench/offline_sm90_compiles.sh: checks for its
# Triton 3.6 venv (VENV, default /tmp/triton36; that script creates it) and defines
# ``run OUT_JSON KERNEL PRESETS [--only ...] [--configs ...]``, bench/kernel_resources.py compiling offline.
venv=${VENV:-/tmp/triton36}
mkdir -p "$out"  # the sourcing script sets out
[ -x "$venv/bin/python" ] || { echo "no Triton 3.6 venv at $venv: run bench/offline_sm90_compiles.sh first" >&2; exit 2; }
run() { PYTHONPATH=. "$venv/bin/python" bench/kernel_resources.py kernels/tables/sm_90.json "$@" --offline-arch sm_90; }
