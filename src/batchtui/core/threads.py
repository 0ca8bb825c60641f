"""How many CPU threads torch's kernels use. CPU kernels split their work by the count, so it is part of the
computation: the default is the same on every run on a machine, whatever else is running then (torch's own:
its count of the cores, or OMP_NUM_THREADS), for the app and every command alike; `--threads` changes it, and
every report records it."""

from __future__ import annotations

import os

# `--threads` at most this many times the machine's cores: more only slows the kernels down, and far more (tens of
# thousands) crashes the OpenMP runtime.
THREADS_PER_CORE = 4

_torch_default: int | None = None  # torch's own count, read before any change


def default_threads() -> int:
    import torch

    global _torch_default
    if _torch_default is None:
        _torch_default = torch.get_num_threads()
    return _torch_default


def most_threads() -> int:
    """The largest `--threads` taken on this machine."""
    return THREADS_PER_CORE * (os.cpu_count() or 1)


def use_threads(requested: int | None) -> int:
    """Set torch's CPU thread count to `requested`, or the default; returns it."""
    import torch

    count = requested or default_threads()
    torch.set_num_threads(count)
    return count
