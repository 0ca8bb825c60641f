"""Where two runs of a model part: each recorded module's output at chosen places of a run, and the first module, in
run order, whose outputs differ."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from ..models.hooks import own_thread

Key = TypeVar("Key", bound=Hashable)


def module_outputs(
    model: torch.nn.Module, names: list[str], run: Callable[[], object], places: dict[Key, tuple[int, int, int]]
) -> dict[Key, dict[str, torch.Tensor]]:
    """key -> {module name: its output there} while `run()` runs the model: `places` maps each key to (the model's
    pass, counted from 0, as a decode's steps are; the row; the position) of the modules' [b, T, H] outputs (a
    module called twice in a pass: its last call)."""
    named = dict(model.named_modules())
    passes = [-1]
    kept: dict[Key, dict[str, torch.Tensor]] = {}

    def count(module, args):
        passes[0] += 1

    def keep(name: str):
        def hook(module, args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
                return
            for key, (pass_, row, position) in places.items():
                if pass_ == passes[0]:
                    kept.setdefault(key, {})[name] = tensor[row, position].detach().clone()

        return hook

    handles = [model.register_forward_pre_hook(own_thread(count))]
    handles += [named[name].register_forward_hook(own_thread(keep(name))) for name in names if name in named]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return kept


def first_differing(order: list[str], first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> str | None:
    """The first module of `order` whose outputs in the two runs are not the same bits; None where none is."""
    return next(
        (name for name in order if name in first and name in second and not torch.equal(first[name], second[name])),
        None,
    )
