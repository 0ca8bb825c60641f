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


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the OS now (glibc's `malloc_trim`): a long run of batches of ever other
    shapes otherwise leaves its peak growing with their number, in freed pieces the next batch does not fit."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc/self/statm), or None where it cannot be read."""
    import os

    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class FlatHeap:
    """Called after each unit of a long run (a batch): the most the process held after its first `settle` units is
    its level; where it later holds more than `slack` bytes above that, the heap's free pages go back to the OS
    (`release_freed_memory`). Handing them back after every batch cost a third more time (the next batch faults its
    pages in afresh); never, the peak grew with the number of batches, in freed pieces of other shapes the next batch
    did not fit."""

    def __init__(self, slack: int = 48 << 20, settle: int = 4) -> None:
        self.slack = slack
        self.settle = settle
        self.level = 0
        self.units = 0

    def __call__(self) -> None:
        self.units += 1
        now = resident_bytes()
        if now is None:
            return
        if self.units <= self.settle:
            self.level = max(self.level, now)
        elif now > self.level + self.slack:
            release_freed_memory()
