"""This process's resident memory, as index building and the retriever's replicas report it."""

from __future__ import annotations

import resource
import sys


def status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status in MB (``VmRSS``, ``VmHWM``, ...); None without /proc."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def resident_memory_mb() -> float:
    """This process's resident memory in MB (``VmRSS``; without /proc, the peak from ``getrusage``)."""
    resident = status_mb("VmRSS")
    if resident is not None:
        return resident
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)
