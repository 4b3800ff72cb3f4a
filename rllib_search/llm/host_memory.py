"""Giving freed host memory back to the operating system.

A CPU learner's update and an engine's batched generation allocate activations and caches of hundreds of
MB and free them when done; glibc keeps what was freed inside its heap for reuse, so a process's resident
memory stays at its largest step's. ``release_free_heap`` hands those free pages back (glibc's
``malloc_trim``), so that between steps a job holds what it uses; ``collect_and_release`` first frees what
only Python's cycle collector would.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # another C library (musl has no malloc_trim)
        return None


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the C library cannot (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def collect_and_release() -> bool:
    """Collect garbage, then ``release_free_heap``: for objects that die in reference cycles (an RLlib
    algorithm and its learner do), whose memory Python frees only when its cycle collector runs."""
    gc.collect()
    return release_free_heap()
