"""A two-trial Tune experiment through ``fit_or_restore`` whose driver is killed mid-run: the driver that
``test_sweeps.py`` starts twice.

``python tests/interrupted_sweep.py STORAGE`` runs ``seed`` 0 and 1 one at a time (``max_concurrent=1``,
so the second trial does not exist until the first ends), 3 iterations each, with a non-primitive value
in the param space (Tune stores it as a placeholder). On the first run the seed-0 trial kills its driver
with SIGKILL at iteration 2, once Tune has saved the experiment's state (a marker file makes that happen
once); the second run resumes the experiment and must create and configure the seed-1 trial itself.
Each finished trial's ``result.json`` records the payload's tag it saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from ray import tune

ITERATIONS = 3


class Payload:
    """A value Tune cannot store as JSON (a stand-in for the records and classes an AlgorithmConfig holds)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


class Counter(tune.Trainable):
    """Counts iterations, checkpoints the count, reports the payload's tag."""

    def setup(self, config: dict) -> None:
        self.count = 0

    def step(self) -> dict:
        self.count += 1
        marker = Path(self.config["storage"]) / "driver_killed"
        if self.config["seed"] == 0 and self.count == 2 and not marker.exists():
            experiment = Path(self.config["storage"]) / "sweep"
            deadline = time.monotonic() + 120
            while not list(experiment.glob("experiment_state-*.json")) and time.monotonic() < deadline:
                time.sleep(0.5)
            marker.touch()
            os.kill(self.config["driver_pid"], signal.SIGKILL)
            time.sleep(60)
        return {"count": self.count, "payload_tag": self.config["payload"].tag}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        Path(checkpoint_dir, "count.json").write_text(json.dumps(self.count))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.count = json.loads(Path(checkpoint_dir, "count.json").read_text())


def main() -> None:
    import ray

    from rllib_search.recipes.sweeps import fit_or_restore

    storage = Path(sys.argv[1])
    marker_existed = (storage / "driver_killed").exists()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    param_space = {
        "seed": tune.grid_search([0, 1]),
        "payload": Payload("resolved"),
        "storage": str(storage),
        # The first driver's pid: the trial kills it once; the resumed run keeps the first run's configs.
        "driver_pid": os.getpid(),
    }
    results = fit_or_restore(
        Counter, param_space, storage=storage, name="sweep", iterations=ITERATIONS, max_concurrent=1
    )
    print(f"finished {len(results)} trials (marker existed: {marker_existed})", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
