"""Where tasks run, freed memory stays with the process (glibc only; elsewhere nothing changes).

A task allocates and frees numpy arrays of 0.1-10 MB thousands of times (per-step traces of a
16K-token run). By default glibc's malloc serves the larger ones with mmap and gives the top of
the heap back to the OS once 128 KiB of it is free, so every allocation maps fresh pages that the
kernel must fault in and zero: the report's projection spent as much time in the kernel as in
Python (1.4 s system next to 1.4 s user on one 16K-token model column). Raising the two thresholds
keeps those pages in the heap for the next array: the same results, the system time near zero.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
TRIM_THRESHOLD_BYTES = 256 * 2**20  # free heap top kept before it is returned to the OS
MMAP_THRESHOLD_BYTES = 32 * 2**20  # allocations from the heap up to this size (glibc's maximum on 64-bit)

_done = False


def keep_freed_memory() -> None:
    """Once per process; a no-op where the C library has no mallopt."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return
    _done = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
