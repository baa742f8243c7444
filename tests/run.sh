#!/usr/bin/env bash
# Sets up a virtual environment with the project and runs the test suite (CPU interpreter;
# the PostgreSQL variants run when TUNER_TEST_POSTGRES_URL names a server).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q torch==2.13.0
pip install -q -e '.[test]'
TRITON_INTERPRET=1 python -m pytest -q -ra "$@"
