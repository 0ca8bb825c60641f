"""A model's attention routed to the mode's (`NAME`) while a thread is inside a block for it.

transformers reads which attention function a layer calls, and which mask a pass builds, off the model's config:
one object, shared by every thread. The first entry for a model routes its configs, the last exit (of whichever
thread) restores them. A pass of a thread that has not entered keeps the model's own attention and mask: the app's
older run in the mode and its newer run outside it overlap for a pass, and each must get what it asked for.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

from ..compat.transformers import attn_implementation_field, holds_attn_implementation
from .scopes import SharedScope

NAME = "batchtui_invariant"

_local = threading.local()  # `depth`: how many routing blocks this thread is inside

# id(config) -> the attention implementation the model had before it was routed.
_inner: dict[int, str] = {}


def routed_here() -> bool:
    """Whether the calling thread is inside a routing block: its passes attend the mode's way."""
    return getattr(_local, "depth", 0) > 0


def inner_implementation(config) -> str | None:
    """The attention implementation `config`'s model had before it was routed to `NAME` (None: not routed)."""
    return _inner.get(id(config))


def _mask_by_thread(*args, config=None, **kwargs):
    """The mask a pass builds under `NAME`: SDPA's (None where it is only causal) in a
    thread in the mode; elsewhere the one the model's own attention takes (eager's is additive)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    own = (inner_implementation(config) if config is not None else None) or "sdpa"
    if routed_here() or own not in ALL_MASK_ATTENTION_FUNCTIONS:
        return sdpa_mask(*args, config=config, **kwargs)
    return ALL_MASK_ATTENTION_FUNCTIONS[own](*args, config=config, **kwargs)


class _Registration(SharedScope):
    """`NAME` in transformers' attention and mask interfaces, running `attend`, while any model is routed."""

    def __init__(self, attend: Callable) -> None:
        self._attend = attend

    def _install(self) -> None:
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface.register(NAME, self._attend)
        AttentionMaskInterface.register(NAME, _mask_by_thread)

    def _remove(self) -> None:
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        AttentionInterface._global_mapping.pop(NAME, None)
        AttentionMaskInterface._global_mapping.pop(NAME, None)


def _configs(model, modules: Sequence | None = None) -> list:
    """Every config object the model's modules (`modules`, where walked already) read their attention implementation
    from."""
    found = {id(model.config): model.config}
    for module in model.modules() if modules is None else modules:
        # A module's config is a plain attribute, read where it lives: asked of a module without one,
        # `nn.Module.__getattr__` raises (each entry of the mode asks every module: half of this walk's cost)
        config = vars(module).get("config")
        if config is None and hasattr(type(module), "config"):  # a property or a class attribute
            config = getattr(module, "config", None)
        if config is not None and id(config) not in found and holds_attn_implementation(config):
            found[id(config)] = config
    return list(found.values())


class AttentionRouting:
    """`model`'s configs routed to `NAME` (running `attend`) while entered; entries nest and come from several
    threads, and only the calling thread's passes attend the mode's way (`routed_here`)."""

    _lock = threading.Lock()
    _held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [entries, [(config, its own)]]

    def __init__(self, model, attend: Callable, modules: Sequence | None = None) -> None:
        self._model, self._modules = model, modules
        self._registration = _Registration(attend)

    def __enter__(self) -> AttentionRouting:
        cls = type(self)
        self._registration.__enter__()
        with cls._lock:
            held = cls._held.get(self._model)
            if held is None:
                configs = _configs(self._model, self._modules)
                saved = [
                    (c, getattr(c, attn_implementation_field(c)))
                    for c in configs
                    if getattr(c, attn_implementation_field(c)) != NAME
                ]
                for config, own in saved:
                    _inner[id(config)] = own or "eager"
                    setattr(config, attn_implementation_field(config), NAME)
                held = cls._held[self._model] = [0, saved]
            held[0] += 1
        _local.depth = getattr(_local, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        cls = type(self)
        _local.depth -= 1
        with cls._lock:
            held = cls._held[self._model]
            held[0] -= 1
            if held[0] == 0:
                for config, own in held[1]:
                    setattr(config, attn_implementation_field(config), own)
                    _inner.pop(id(config), None)
                del cls._held[self._model]
        self._registration.__exit__(*exc)
