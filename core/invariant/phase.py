"""Which phase a model's forward pass is in: a prefill (a pass over a prompt) or a decoding step (one new position
per row, over a cache that already holds positions).

A text alone and the same text in a batch take the same phases at the same steps, so the mode may compute a
decoding step's rows another way than a prefill's and still give each text the same bits alone and batched
(`invariant.linear`: a decoding step's few rows each as the library computes one row alone)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from ..models.hooks import own_thread

PHASES = ("prefill", "decode")

_local = threading.local()  # `kinds`: `pass_kind()` of this thread's passes under way, innermost last


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


def decoding() -> bool:
    """Whether this thread is inside a decoding step of a model whose phases are followed (`tracking_phases`)."""
    return pass_kind()[1]


def pass_kind() -> tuple[int, bool]:
    """(the thread count, whether a decoding step) of this thread's pass under way, taken as it started: what a
    kernel's choice is kept by, read once per call of every linear layer; outside a followed pass, as they are now."""
    kinds = getattr(_local, "kinds", None)
    return kinds[-1] if kinds else (torch.get_num_threads(), False)


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


def _push(phase: str) -> None:
    if not hasattr(_local, "kinds"):
        _local.kinds = []
    _local.kinds.append((torch.get_num_threads(), phase == "decode"))


def _pop(phase: str) -> None:
    _local.kinds.pop()


def tracking_phases(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """While entered, `decoding()` tells, in the thread running it, whether a forward pass of `model` is a decoding
    step."""
    return on_each_pass(model, _push, _pop)
