"""Positions counted from each row's first real token, for a model called with a padding mask and no position ids.

Without position ids a model numbers a batch's places 0, 1, 2... whatever the mask holds, so a left-padded row's
first token sits at place `padding`, and how much padding a row gets depends on the other rows: a row's logits then
depend on its batch, which no kernel can undo. A trainer's loss forward is often such a call (TRL's GRPO trainer
passes the mask alone). While `PositionsFromMask(model)` is entered, a call of the model in this thread with a 2-D
attention mask and no position ids gets `mask.cumsum(-1) - 1` (padded places 1), its last columns where the call
carries fewer tokens than the mask (a step over a KV cache): what `generate` passes. A call that gives position ids,
or no mask, or a model whose forward takes none, is left as it is.
"""

from __future__ import annotations

import inspect

import torch
from torch.utils.hooks import RemovableHandle

from ..models.hooks import own_thread


def positions_from_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    """[b, length]: each row's places counted from its first real token (`generate`'s), the last `length` of them."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)[:, -length:]


class PositionsFromMask:
    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handle: RemovableHandle | None = None

    def __enter__(self) -> PositionsFromMask:
        if "position_ids" in inspect.signature(self._model.forward).parameters:
            self._handle = self._model.register_forward_pre_hook(own_thread(_with_positions), with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _with_positions(module: torch.nn.Module, args: tuple, kwargs: dict):
    mask = kwargs.get("attention_mask")
    if kwargs.get("position_ids") is not None or not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    tokens = kwargs.get("input_ids", args[0] if args else None)
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2 or tokens.shape[1] > mask.shape[1]:
        return None
    return args, {**kwargs, "position_ids": positions_from_mask(mask, tokens.shape[1])}
