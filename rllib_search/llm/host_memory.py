"""Giving freed host memory back to the operating system.

A CPU learner's update and an engine's batched generation allocate activations and caches of hundreds of
MB and free them when done; glibc keeps what was freed inside its heap for reuse, so a process's resident
memory stays at its largest step's. ``release_free_heap`` hands those free pages back (glibc's
``malloc_trim``), so that between steps a job holds what it uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
