"""Randomness a model draws in training, refused in the mode: a forward that samples (dropout above 0, a router's
jitter noise) gives other logits on every call, so no two arrivals of a text can agree. Attention dropout is refused
where attention is called (`invariant.attention`); this refuses the rest at the model's forward, while it trains."""

from __future__ import annotations

import torch
from torch.utils.hooks import RemovableHandle

from ..errors import NotInvariant
from ..models.hooks import own_thread

# Config attributes of a router's noise in training (PhiMoE's `router_jitter_noise`, Switch-style `jitter_noise`)
_JITTER = ("router_jitter_noise", "jitter_noise")


class RandomnessRefused:
    """While entered, a forward of `model` in training mode in this thread with a dropout above 0 or a router's
    jitter noise above 0 raises NotInvariant, in one line naming it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handle: RemovableHandle | None = None
        # one walk: the dropouts by name, and what may hold a router's noise (the config, and each module that keeps
        # a copy of its own: PhiMoE's router reads its attribute, set from the config when it was made)
        self._dropouts: list[tuple[str, torch.nn.Dropout]] = []
        self._holders: list = [model.config] if any(hasattr(getattr(model, "config", None), n) for n in _JITTER) else []
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Dropout):
                self._dropouts.append((name, module))
            if any(noise in vars(module) for noise in _JITTER):
                self._holders.append(module)

    def __enter__(self) -> RandomnessRefused:
        if self._dropouts or self._holders:
            self._handle = self._model.register_forward_pre_hook(own_thread(self._check))
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _check(self, module: torch.nn.Module, args: tuple) -> None:
        if not module.training:
            return
        for holder in self._holders:
            for name in _JITTER:
                noise = getattr(holder, name, 0.0)
                if isinstance(noise, (int, float)) and noise > 0:
                    raise NotInvariant(
                        f"{type(module).__name__} samples its router's {name} ({noise:g}) in training: no two runs "
                        f"agree (set config.{name} = 0, or run it in eval())"
                    )
        for name, dropout in self._dropouts:
            if dropout.p > 0:
                raise NotInvariant(
                    f"dropout {dropout.p:g} at {name} draws random masks in training: no two runs agree (train with "
                    "dropout 0, as RL trainers do)"
                )

