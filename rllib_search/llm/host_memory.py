"""Giving freed host memory back to the operating system.

A CPU learner's update and an engine's batched generation allocate activations and caches of hundreds of
MB and free them when done; glibc keeps what was freed inside its heap for reuse, so a process's resident
memory stays at its largest step's. ``release_free_heap`` hands those free pages back (glibc's
``malloc_trim``), so that between steps a job holds what it uses; ``collect_and_release`` first frees what
only Python's cycle collector would.

Between steps is not enough where a job's peak is made of many such buffers of different sizes: glibc serves
an allocation above its mmap threshold by a mapping of its own, returned at free, but raises that threshold
to each such block it frees (up to 32 MB), so that tensors of a few MB soon come from the heap, where the
freed ones fragment it and later, differently sized buffers grow it further. ``map_large_allocations`` fixes
the threshold instead (the CPU main job sets 1 MiB; its peak with and without is in docs/main_job.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"  # the same, read by glibc when a process starts


@functools.cache
def _glibc_function(name: str):
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)
    except (OSError, AttributeError):  # another C library (musl has neither malloc_trim nor mallopt)
        return None


def map_large_allocations(threshold_bytes: int = 1 << 20) -> bool:
    """Serve every allocation of at least ``threshold_bytes`` by a mapping of its own, returned to the OS when
    it is freed, in this process (glibc's ``mallopt``) and in the processes it starts from now on (Ray's
    workers and services: ``MALLOC_MMAP_THRESHOLD_`` in the environment). A threshold already set in the
    environment wins (one that is not a whole number is replaced). The price is time: each such buffer's
    pages are faulted in afresh. False where the C library cannot (not glibc)."""
    try:
        threshold = int(os.environ.setdefault(MMAP_THRESHOLD_VARIABLE, str(threshold_bytes)))
    except ValueError:
        threshold = threshold_bytes
        os.environ[MMAP_THRESHOLD_VARIABLE] = str(threshold)
    mallopt = _glibc_function("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, threshold) == 1


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the C library cannot (not glibc)."""
    trim = _glibc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def collect_and_release() -> bool:
    """Collect garbage, then ``release_free_heap``: for objects that die in reference cycles (an RLlib
    algorithm and its learner do), whose memory Python frees only when its cycle collector runs."""
    gc.collect()
    return release_free_heap()
