"""How many CPU threads torch's kernels use. By default the cores this process may use less those other work
keeps busy when the command starts: on a shared server a run does not oversubscribe the cores (a 2-core box
with one busy core ran `generate` 5x faster on one thread than on torch's default of two)."""

from __future__ import annotations

import functools
import os
import time

_torch_default: int | None = None  # torch's own count (physical cores), read before any change
_SAMPLE_S = 0.1  # how long busy cores are watched: the ticks of /proc/stat are 10 ms


@functools.cache
def free_cores() -> int:
    """Cores this process may use that other work leaves free when first asked (at least 1): the cores are
    watched for a moment, less this process's own use of them. (The 1-minute load average, where nothing else
    can be read, also counts work that has just ended, such as this tool's own previous command.)"""
    cores = _usable_cores()
    busy = _busy_cores_now(cores)
    if busy is None:
        try:
            busy = int(os.getloadavg()[0] + 0.5)
        except OSError:
            busy = 0
    return max(1, cores - busy)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _busy_cores_now(cores: int) -> int | None:
    """Cores other processes keep busy, watched for `_SAMPLE_S`; None where /proc/stat cannot be read."""
    try:
        mine = os.sched_getaffinity(0)
        before, own_before, start = _busy_ticks(mine), time.process_time(), time.monotonic()
        time.sleep(_SAMPLE_S)
        after, own_after, end = _busy_ticks(mine), time.process_time(), time.monotonic()
    except (AttributeError, OSError, ValueError):
        return None
    return busy_cores(after - before, os.sysconf("SC_CLK_TCK"), own_after - own_before, end - start, cores)


def busy_cores(busy_ticks: int, ticks_per_second: int, own_seconds: float, seconds: float, cores: int) -> int:
    """Cores kept busy by others over `seconds`: the CPUs' busy time less this process's own, to the nearest
    whole core, 0..cores."""
    others = busy_ticks / ticks_per_second - own_seconds
    return min(cores, max(0, round(others / seconds)))


def _busy_ticks(cpus: set[int]) -> int:
    """Ticks the CPUs in `cpus` spent on anything but idling and waiting for I/O, from /proc/stat."""
    total = 0
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(field) for field in fields[:8]]  # user nice system idle iowait irq softirq steal
                total += sum(ticks) - ticks[3] - ticks[4]
    return total


def use_threads(requested: int | None, keep_for_ui: bool = False) -> int:
    """Set torch's CPU thread count: `requested`, or torch's default capped at the free cores (less one kept for
    an interface that must answer keys mid-run, when every core would be busy). Returns it."""
    import torch

    global _torch_default
    if _torch_default is None:
        _torch_default = torch.get_num_threads()
    count = requested if requested else min(_torch_default, free_cores()) if _torch_default > 1 else 1
    if keep_for_ui and not requested and 1 < count >= (os.cpu_count() or 1):
        count -= 1
    torch.set_num_threads(count)
    return count
