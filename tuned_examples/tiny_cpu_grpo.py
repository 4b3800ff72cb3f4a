"""The CPU main job: teach SmolLM2-135M-Instruct to chain searches with GRPO, on 2 CPU cores.

    python tuned_examples/tiny_cpu_grpo.py            # the whole job (about 8 minutes with AVX512-BF16)
    python tuned_examples/tiny_cpu_grpo.py --smoke    # every stage at the smallest size (minutes)
    python tuned_examples/tiny_cpu_grpo.py --warm-start runs/tiny_cpu_grpo/warm_start_model  # GRPO only
    RAY_AUTH_MODE=token ray job submit --working-dir . -- python tuned_examples/tiny_cpu_grpo.py

The same job as ``rllib-search train tiny_cpu``: its stages, flags and outputs are in
``rllib_search/recipes/tiny_cpu/cli.py`` (``--help`` prints them); the stages themselves in
``rllib_search/recipes/tiny_cpu/job.py`` and the settings in ``rllib_search/recipes/tiny_cpu/config.py``.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from rllib_search.recipes.tiny_cpu.cli import DEFAULTS, build_parser, main, numbers, parse_config

__all__ = ["DEFAULTS", "build_parser", "main", "numbers", "parse_config"]

if __name__ == "__main__":
    sys.exit(main())
