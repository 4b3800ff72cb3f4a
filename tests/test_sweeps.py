"""``rllib_search.recipes.sweeps.fit_or_restore`` resumes a Tune experiment whose driver was killed before
all its trials existed: the restored run creates the missing trial with its param space resolved (Tune
keeps non-primitive values as placeholders that only the param space given back on restore resolves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_a_killed_sweep_resumes_and_configures_the_trials_it_had_not_started(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    command = [sys.executable, str(ROOT / "tests" / "interrupted_sweep.py"), str(tmp_path)]

    first = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert first.returncode == -9, first.stdout[-2000:] + first.stderr[-2000:]  # killed by its trial
    assert (tmp_path / "driver_killed").exists()
    assert not list((tmp_path / "sweep").glob("*seed=1*")), "the seed-1 trial must not exist yet"

    second = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "finished 2 trials (marker existed: True)" in second.stdout
    finals = {}
    for result_file in (tmp_path / "sweep").glob("*/result.json"):
        last = json.loads(result_file.read_text().strip().splitlines()[-1])
        finals[last["config"]["seed"]] = (last["count"], last["payload_tag"])
    assert finals == {0: (3, "resolved"), 1: (3, "resolved")}
