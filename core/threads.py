"""How many CPU threads torch's kernels use. By default the cores this process may use less those already
busy when the command starts: on a shared server a run does not oversubscribe the cores (a 2-core box
with one busy core ran `generate` 5x faster on one thread than on torch's default of two)."""

from __future__ import annotations

import os

_torch_default: int | None = None  # torch's own count (physical cores), read before any change


def free_cores() -> int:
    """Cores this process may use that the 1-minute load average leaves free (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        busy = int(os.getloadavg()[0] + 0.5)
    except OSError:
        busy = 0
    return max(1, cores - busy)


def use_threads(requested: int | None, keep_for_ui: bool = False) -> int:
    """Set torch's CPU thread count: `requested`, or torch's default capped at the free cores (less one kept for
    an interface that must answer keys mid-run, when every core would be busy). Returns it."""
    import torch

    global _torch_default
    if _torch_default is None:
        _torch_default = torch.get_num_threads()
    count = requested if requested else min(_torch_default, free_cores())
    if keep_for_ui and not requested and 1 < count >= (os.cpu_count() or 1):
        count -= 1
    torch.set_num_threads(count)
    return count
