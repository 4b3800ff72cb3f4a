"""The env is registered through public Ray/RLlib and gymnasium APIs and found in every Ray session."""

from __future__ import annotations

import subprocess
import sys


def test_rllib_finds_the_env_in_every_ray_session_of_a_process():
    script = (
        "import rllib_search, ray, gymnasium\n"
        "from ray.rllib.algorithms.algorithm import Algorithm\n"
        "from rllib_search.algos import SearchGRPOConfig\n"
        "assert rllib_search.ENV_ID in gymnasium.registry\n"
        "for _ in range(2):\n"
        "    ray.init(address='local', num_cpus=1, include_dashboard=False)\n"
        "    env_id, creator = Algorithm._get_env_id_and_creator(rllib_search.ENV_ID, SearchGRPOConfig())\n"
        "    assert env_id == rllib_search.ENV_ID\n"
        "    try:\n"
        "        creator({'retriever': None})\n"
        "        raise SystemExit('make_env was not reached')\n"
        "    except Exception as error:\n"
        "        assert \"needs 'tokenizer'\" in str(error), error\n"
        "    ray.shutdown()\n"
        "import ray._private.worker as worker\n"
        "hooks = getattr(worker, '_post_init_hooks', [])\n"
        "assert not any(getattr(h, '__module__', '').startswith('rllib_search') for h in hooks), hooks\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
