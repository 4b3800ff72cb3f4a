#!/usr/bin/env bash
# Set up the venv if needed, then run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_DEDUP_LOGS=0
# Ray Train's controller polls its workers every 2 s by default, so each of the suite's short TorchTrainer
# fits waits seconds after its workers are done; 0.2 s polls end them when they end.
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2
.venv/bin/ruff check rllib_search tests benchmarks tuned_examples
# One pytest worker per core, at most 4 (RLLIB_SEARCH_TEST_WORKERS overrides; 0 runs in this process), each
# running whole files (their module fixtures are set up once). Most tests wait on process start-up, Ray and
# Serve, so two workers on two cores finish it in about two thirds of the time one takes.
cores=$(nproc)
workers=${RLLIB_SEARCH_TEST_WORKERS:-$((cores < 4 ? cores : 4))}
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadfile)
fi
# The 15 slowest tests are listed at the end: the suite's time is kept under 20 minutes on 2 cores.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "$@"
