"""Where a generation's time goes: the model's forward passes timed by phase, the prefill (a pass over a prompt)
and the decode (a pass of one new position per row, over the cache).

A pass's phase is read off what it is given (`invariant.phase.phase_of`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

from ..invariant.phase import PHASES, on_each_pass


@contextlib.contextmanager
def phase_clock(model: torch.nn.Module, synchronize=lambda: None) -> Iterator[dict[str, float]]:
    """While entered, the seconds `model`'s forward passes take, by phase, in the dict it gives (filled in as
    they run). `synchronize` waits for the device's queued work (CUDA) before each reading."""
    seconds = dict.fromkeys(PHASES, 0.0)
    started: list[float] = []

    def before(phase: str) -> None:
        synchronize()
        started.append(time.perf_counter())

    def after(phase: str) -> None:
        synchronize()
        seconds[phase] += time.perf_counter() - started.pop()

    with on_each_pass(model, before, after):
        yield seconds
