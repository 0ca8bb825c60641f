"""How `bench` times a method and measures its memory: wall time with the device synchronized, its peak memory
above the weights (CUDA's allocator's peak; on the CPU the resident set's growth, sampled)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds `fn` takes, the device's queued work included."""
    synchronize(device)
    started = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - started


class _RssSampler:
    """Peak resident-set size of this process while running, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> _RssSampler:
        self.start = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def peak_memory(fn: Callable[[], object], device: str) -> int:
    """Bytes allocated at the peak of `fn` above what was allocated before it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    _return_freed_memory()
    with _RssSampler() as sampler:
        fn()
    return sampler.peak - sampler.start


def _return_freed_memory() -> None:
    """Hand freed heap back to the OS, so that RSS growth measures this run and not the last one's leftovers."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure is then an upper bound
        pass
