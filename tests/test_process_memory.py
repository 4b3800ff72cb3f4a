"""The job's memory across its processes: PSS summed over the driver and every process it started."""

from __future__ import annotations

import subprocess
import sys

import psutil

from rllib_search.recipes.process_memory import JobMemory, process_label

HOLD = "import sys; block = b'x' * (300 * 2**20); print('ready', flush=True); sys.stdin.readline()"


def test_a_child_process_memory_counts_toward_the_peak_of_its_stage():
    memory = JobMemory(interval_s=60.0)  # sampled by hand here; the thread would sample once a minute
    memory.stage("before")
    before = memory.sample()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        label = process_label(psutil.Process(child.pid))
        memory.stage("holding")
        holding = memory.sample()
    finally:
        child.communicate("done\n", timeout=60)
    # The child's 300 MB, counted once, under its label (the rest of this process's tree may move meanwhile).
    assert holding.get(label, 0.0) - before.get(label, 0.0) > 290
    summary = memory.summary()
    assert summary["peak_stage"] == "holding"
    assert summary["peak_pss_mb"] >= sum(holding.values()) - 1
    assert summary["peak_pss_mb_by_stage"]["holding"] > summary["peak_pss_mb_by_stage"]["before"]
    assert max(summary["peak_pss_mb_by_process"].values()) > 290  # the child, by its label


def test_the_sampling_thread_runs_until_stopped():
    with JobMemory(interval_s=0.05) as memory:
        memory.stage("work")
        block = b"y" * (50 * 2**20)
        while memory.samples < 3:
            memory._stop.wait(0.05)
    assert len(block) and memory.summary()["samples"] >= 4  # the last one taken at stop
    assert memory.summary()["peak_pss_mb"] > 50


def test_a_part_of_a_stage_has_its_own_peak_and_the_stage_resumes_after_it():
    memory = JobMemory(interval_s=60.0)
    memory.stage("rl")
    with memory.within("evaluation"):
        assert memory.current_stage == "rl: evaluation"
        memory.sample()
    assert memory.current_stage == "rl"
    memory.sample()
    assert set(memory.summary()["peak_pss_mb_by_stage"]) == {"rl", "rl: evaluation"}


def test_a_stage_shorter_than_the_interval_still_has_its_peak():
    memory = JobMemory(interval_s=60.0)  # the thread never runs: only stage boundaries sample
    memory.stage("short")
    memory.stage("next")
    with memory.within("part"):
        pass
    assert {"short", "next", "next: part"} <= set(memory.summary()["peak_pss_mb_by_stage"])


def test_the_drivers_exact_peak_is_kept_per_stage_even_between_samples():
    """A block held for far less than the sampling interval still shows in its stage's driver peak (the
    kernel's high-water mark), and the next stage starts from what the driver holds then."""
    import numpy as np

    memory = JobMemory(interval_s=60.0)
    memory.stage("quiet")
    memory.stage("burst")
    block = np.ones(400 * 1024 * 1024 // 8)  # 400 MB, touched, then freed before any sample
    del block
    memory.stage("after")
    summary = memory.summary()
    by_stage = summary["driver_peak_rss_mb_by_stage"]
    assert by_stage["burst"] - by_stage["quiet"] > 300
    assert by_stage["after"] < by_stage["burst"] - 300
    assert summary["driver_peak_rss_mb"] == by_stage["burst"]
