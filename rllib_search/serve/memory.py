"""This process's resident memory, as index building and the retriever's replicas report it."""

from __future__ import annotations

import resource
import sys


def resident_memory_mb() -> float:
    """This process's resident memory in MB (``VmRSS``; without /proc, the peak from ``getrusage``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)
