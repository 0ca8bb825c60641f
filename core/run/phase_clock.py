"""Where a generation's time goes: the model's forward passes timed by phase, the prefill (a pass over a prompt)
and the decode (a pass of one new position per row, over the cache).

A pass's phase is read off what it is given: one position per row (input ids or embeddings one wide) over a
cache that already holds positions is a decoding step; anything else, a prefill."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

PHASES = ("prefill", "decode")


def _phase(args: tuple, kwargs: dict) -> str:
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
def phase_clock(model: torch.nn.Module, synchronize=lambda: None) -> Iterator[dict[str, float]]:
    """While entered, the seconds `model`'s forward passes take, by phase, in the dict it gives (filled in as
    they run). `synchronize` waits for the device's queued work (CUDA) before each reading."""
    seconds = dict.fromkeys(PHASES, 0.0)
    started: list[tuple[str, float]] = []

    def before(module, args, kwargs):
        synchronize()
        started.append((_phase(args, kwargs), time.perf_counter()))

    def after(module, args, kwargs, output):
        synchronize()
        phase, start = started.pop()
        seconds[phase] += time.perf_counter() - start

    handles = [
        model.register_forward_pre_hook(before, with_kwargs=True),
        model.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        yield seconds
    finally:
        for handle in handles:
            handle.remove()
