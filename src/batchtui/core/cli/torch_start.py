"""Torch started for a command once its arguments are known good."""

from __future__ import annotations

import argparse
import sys

from ..visible import literal


def start_torch(args: argparse.Namespace, keep_freed: bool = True) -> None:
    """Torch loaded and set up for the run: its kernel threads (`--threads`) and, with `keep_freed`, the allocator
    keeping freed blocks for reuse (a run of thousands of batches of other shapes would grow its heap with them).
    Each command calls it once its arguments are known good, so a bad value is refused without the import (about two
    seconds). A cache folder that cannot be used is said here, once: the run goes on without it. What the mode
    measures on its first use is said as it goes (`MeasuringLine`)."""
    from ..cache_folder import cache_notice
    from ..invariant.measuring import listen
    from ..numbers.cpu_memory import keep_freed_memory
    from ..threads import use_threads
    from .measuring_line import MeasuringLine

    if notice := cache_notice():
        print(f"batchtui: notice: {literal(notice)}", file=sys.stderr)
    listen(MeasuringLine())  # the mode's first passes on this machine measure its kernels: said as they do
    use_threads(args.threads)
    if keep_freed:
        keep_freed_memory()
