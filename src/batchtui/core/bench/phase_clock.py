"""Where a generation's time goes: the model's forward passes timed by phase, the prefill (a pass over a prompt)
and the decode (a pass of one new position per row, over the cache).

A pass's phase is read off what it is given (`phase_of`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from ..models.hooks import own_thread

PHASES = ("prefill", "decode")


def phase_of(args: tuple, kwargs: dict) -> str:
    """The phase of a forward pass given these arguments: "decode" for one position per row (input ids or
    embeddings one wide) over a cache that holds positions, else "prefill"."""
    given = kwargs.get("input_ids")
    if given is None:
        given = kwargs.get("inputs_embeds")
    if given is None and args:
        given = args[0]
    width = given.shape[1] if isinstance(given, torch.Tensor) and given.dim() >= 2 else None
    # transformers names the cache `past_key_values`, or `cache` in its newer models' forward
    cache = next((kwargs[name] for name in ("past_key_values", "cache") if kwargs.get(name) is not None), None)
    held = getattr(cache, "get_seq_length", None)
    cached = cache is not None and (held() > 0 if held is not None else True)
    return "decode" if width == 1 and cached else "prefill"


@contextlib.contextmanager
def on_each_pass(model: torch.nn.Module, before: Callable, after: Callable) -> Iterator[None]:
    """While entered, `before(phase)` as each forward pass of `model` starts and `after(phase)` as it ends (on an
    exception too). Entries nest: each adds its own hooks and removes them on exit."""
    started: list[str] = []

    def pre(module, args, kwargs):
        started.append(phase_of(args, kwargs))
        before(started[-1])

    def post(module, args, kwargs, output):
        after(started.pop())

    handles = [
        model.register_forward_pre_hook(own_thread(pre), with_kwargs=True),
        model.register_forward_hook(own_thread(post), with_kwargs=True, always_call=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


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
