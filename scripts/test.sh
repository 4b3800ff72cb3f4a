#!/usr/bin/env bash
# Set up the venv if needed, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_DEDUP_LOGS=0
.venv/bin/ruff check rllib_search tests benchmarks tuned_examples
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
