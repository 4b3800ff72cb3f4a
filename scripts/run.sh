#!/usr/bin/env bash
# Set up the venv if needed, then run the main job on the embedded default (extra arguments go to it):
# warm start + GRPO of the bundled SmolLM2 on the synthetic world, on CPU (tuned_examples/tiny_cpu_grpo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python tuned_examples/tiny_cpu_grpo.py "$@"
