"""The memory of a job across its processes: the driver and every process it started (on a local Ray: the
GCS, the raylet, every worker, Serve's controller and replicas, Ray's agents).

Shared pages count once: each process is measured by its PSS (proportional set size: a page shared by n
processes counts 1/n in each), so the sum over processes is what the job takes from the machine, the object
store's shared memory included once. :class:`JobMemory` samples in a background thread and keeps the peak
of that sum, the stage it happened in and what each kind of process held then.

Sampling can miss a peak shorter than its interval (a backward pass). The driver's own peak is also kept
exactly: the kernel's high-water mark of its resident memory (``VmHWM``), read and reset at every stage
and part boundary (Linux; absent elsewhere).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

MB = 1024 * 1024

# Ray's own processes, told apart by their command line (workers by their process title, "ray::Class").
RAY_SERVICES = (
    ("gcs_server", "gcs_server"),
    ("raylet", "raylet"),
    ("dashboard/agent.py", "dashboard agent"),
    ("runtime_env/agent/main.py", "runtime env agent"),
    ("dashboard/dashboard.py", "dashboard"),
    ("log_monitor.py", "log monitor"),
    ("autoscaler/_private/monitor.py", "autoscaler monitor"),
)


def process_label(process: Any) -> str:
    """What a process is: a Ray worker's class (``ray::LLMEnvRunner.sample`` -> LLMEnvRunner), ``IDLE`` for
    a worker with no task, or one of Ray's services."""
    try:
        cmdline = process.cmdline()
    except Exception:
        return "gone"
    title = cmdline[0] if cmdline else process.name()
    if title.startswith("ray::"):
        name = title[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] or "worker"
        return "learner" if name == "_WrappedExecutable" else name  # RLlib's wrapper of a Learner actor
    joined = " ".join(cmdline)
    for needle, label in RAY_SERVICES:
        if needle in joined:
            return label
    return Path(title).name


class JobMemory:
    """Samples the PSS of this process and its descendants every ``interval_s`` seconds, in a daemon
    thread, and keeps the peak of their sum.

    ``stage(name)`` marks where the job is, so the peak says in which stage it happened; ``within(part)``
    marks a part of the current stage (``"rl: evaluation"``) for as long as its block runs. Use as a context
    manager (or ``start``/``stop``); ``summary()`` is what a job's summary.json records.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        import psutil

        self.root = psutil.Process(os.getpid())
        self.interval_s = interval_s
        self.current_stage = "start"
        self.samples = 0
        self.peak_mb = 0.0
        self.peak_stage = self.current_stage
        self.peak_by_label: dict[str, float] = {}
        self.peak_by_stage: dict[str, float] = {}
        self._labels: dict[int, str] = {}
        self.driver_peak_by_stage: dict[str, float] = {}
        reset_driver_high_water()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stage(self, name: str) -> None:
        """The job enters stage ``name``; samples from now on count under it, starting with one taken now
        (so every stage has a peak, however short it is)."""
        self._close_driver_peak()
        self.current_stage = name
        self.sample()

    def _close_driver_peak(self) -> None:
        """The driver's exact peak RSS since the last boundary goes to the current stage; the kernel's mark
        is reset for the next one."""
        peak = driver_high_water_mb()
        if peak is None:
            return
        stage = self.current_stage
        self.driver_peak_by_stage[stage] = max(self.driver_peak_by_stage.get(stage, 0.0), peak)
        reset_driver_high_water()

    @contextmanager
    def within(self, part: str) -> Iterator[None]:
        """Samples taken while the block runs count under ``"<stage>: <part>"``."""
        outer = self.current_stage
        self._close_driver_peak()
        self.current_stage = f"{outer}: {part}"
        self.sample()
        try:
            yield
        finally:
            self._close_driver_peak()
            self.current_stage = outer

    def sample(self) -> dict[str, float]:
        """PSS (MB) by process label now, summed over processes of a label; updates the peaks."""
        import psutil

        by_label: dict[str, float] = {}
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                pss = process.memory_full_info().pss / MB
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            label = "driver" if process.pid == self.root.pid else process_label(process)
            # A worker's title names its current actor or task; an idle one keeps the label it had.
            if label not in ("IDLE", "gone") or process.pid not in self._labels:
                self._labels[process.pid] = label
            label = self._labels[process.pid]
            by_label[label] = by_label.get(label, 0.0) + pss
        total = sum(by_label.values())
        with self._lock:  # the sampling thread and a stage boundary may both record
            self.samples += 1
            stage = self.current_stage
            self.peak_by_stage[stage] = max(self.peak_by_stage.get(stage, 0.0), total)
            if total > self.peak_mb:
                self.peak_mb, self.peak_stage, self.peak_by_label = total, stage, by_label
        return by_label

    def start(self) -> JobMemory:
        self._thread = threading.Thread(target=self._run, name="job-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self._close_driver_peak()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            self._stop.wait(max(self.interval_s - (time.monotonic() - started), 0.05))

    def __enter__(self) -> JobMemory:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        """The peak of the job's summed PSS (MB), its stage, what each kind of process held then, the
        peak within each stage, and the driver's exact peak RSS in each stage."""
        self._close_driver_peak()
        driver = {k: round(v, 1) for k, v in self.driver_peak_by_stage.items()}
        return {
            "peak_pss_mb": round(self.peak_mb, 1),
            "peak_stage": self.peak_stage,
            "peak_pss_mb_by_process": {k: round(v, 1) for k, v in sorted(self.peak_by_label.items())},
            "peak_pss_mb_by_stage": {k: round(v, 1) for k, v in self.peak_by_stage.items()},
            "driver_peak_rss_mb": max(driver.values(), default=None),
            "driver_peak_rss_mb_by_stage": driver,
            "sample_interval_s": self.interval_s,
            "samples": self.samples,
        }


def driver_high_water_mb() -> float | None:
    """This process's peak resident memory (MB) since it started or since the last reset, from the kernel
    (``VmHWM``); None without /proc."""
    from rllib_search.serve.memory import status_mb

    return status_mb("VmHWM")


def reset_driver_high_water() -> None:
    """Start this process's peak resident memory anew from what it holds now (Linux: ``clear_refs`` 5)."""
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
