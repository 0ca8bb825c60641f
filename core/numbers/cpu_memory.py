"""Freed memory kept in the process for the next block of the same size.

glibc hands every freed block above its mmap threshold back to the OS, and the next such block is page-faulted
in afresh, each page zeroed by the kernel. A comparison frees and allocates blocks of a few MiB per group of
texts (logits widened to float32, their softmax, their differences): on the CPU those page faults cost as much as
the arithmetic. Raising the threshold to glibc's maximum (32 MiB) and the trim threshold with it keeps such
blocks on the heap, for reuse. The commands and the app set it for their own process; the library never does.
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper bound on 64-bit: blocks this large or more are never kept
_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to 32 MiB for reuse, and up to 1 GiB of freed heap; False where the C library
    is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
