"""The mode's attention: every query over the keys it sees, summed in one fixed order (`ordered_attention`).

Two ways in, so that attention is caught wherever a model computes it:
- `attend_in_order`, registered in transformers' `AttentionInterface` (`invariant.routing`; with its mask function
  in `AttentionMaskInterface` under the same name, or transformers would hand it no mask), takes the models that
  attend through the interface, with what their eager attention adds (scaling, soft-capping, sinks, a float bias);
- `InOrderSdpa`, a torch function mode, takes the `scaled_dot_product_attention` calls a model makes itself (every
  torch call of the thread passes through it, which costs: it is entered only for models that make such calls).

Which keys a query sees is read off the mask (a bool one, or an additive float one whose values are kept as a
bias). Where transformers skips a mask that is only causal (a text alone with no padding), the queries are the last
keys (`_causal`); SDPA's own `is_causal` aligns them to the first.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

from ..compat.torch import SDPA
from ..errors import NotInvariant
from .kept_by_identity import KeptByIdentity
from .ordered_attention import ordered_attention
from .routing import inner_implementation, routed_here

_local = threading.local()  # `calls`, `direct`: attention calls counted; `self_only`: the probe's


def attention_calls() -> int:
    """Attention calls this thread has made through the mode (one per attention layer and pass)."""
    return getattr(_local, "calls", 0)


def direct_sdpa_calls() -> int:
    """Of those, the `scaled_dot_product_attention` calls a model made itself, caught by `InOrderSdpa`."""
    return getattr(_local, "direct", 0)


@contextlib.contextmanager
def each_query_attending_itself() -> Iterator[None]:
    """While entered, every query of this thread's attention attends its own key alone: whatever still carries
    one position's content to another is not attention (the mode's probe for other token mixers)."""
    outer = getattr(_local, "self_only", False)
    _local.self_only = True
    try:
        yield
    finally:
        _local.self_only = outer


@functools.lru_cache(maxsize=64)
def _causal(q: int, kv: int, aligned_to_end: bool, device) -> torch.Tensor:
    """[q, kv] bool: each query sees its own key and those before; the queries are the last `q` keys (a pass over a
    cache: transformers' causal mask) or the first (SDPA's `is_causal`)."""
    return torch.ones(q, kv, dtype=torch.bool, device=device).tril(kv - q if aligned_to_end else 0)


# What each query sees, read off a pass's mask once for all its layers.
_seen_kept = KeptByIdentity()


def _seen(mask: torch.Tensor | None, q: int, kv: int, causal: bool, aligned_to_end: bool, device):
    """(which keys each query sees, broadcastable to [b, h, q, kv]; the float mask's values as a bias, or None)."""
    if getattr(_local, "self_only", False):
        return torch.ones(q, dtype=torch.bool, device=device).diag(kv - q)[kv - q :], None
    if mask is None:
        return (_causal(q, kv, aligned_to_end, device) if causal else _everything(device)), None

    def read() -> tuple:
        cut = mask[..., :kv]
        return (cut, None) if cut.dtype == torch.bool else (cut > torch.finfo(cut.dtype).min / 2, cut)

    return _seen_kept.get(mask, (q, kv), read)


@functools.lru_cache(maxsize=8)
def _everything(device) -> torch.Tensor:
    """Every key seen by every query (a layer that attends both ways, no mask)."""
    return torch.ones((), dtype=torch.bool, device=device)


def _call(query, key, value, mask, causal: bool, aligned_to_end: bool, scale, position_bias=None, **extras):
    """[b, h, q, d] attention in order, with the model's extras (`ordered_attention`'s keywords)."""
    if scale is None:
        scale = query.shape[-1] ** -0.5
    attend, bias = _seen(mask, query.shape[2], key.shape[2], causal, aligned_to_end, query.device)
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    return ordered_attention(query, key, value, attend, scale, bias=bias, **extras)


def _count_call() -> None:
    _local.calls = attention_calls() + 1


def _no_dropout(p) -> None:
    if p:
        raise NotInvariant(f"attention dropout {p} draws random masks: no two runs agree (train with dropout 0)")


_SDPA = SDPA


class InOrderSdpa(TorchFunctionMode):
    """Every `scaled_dot_product_attention` call in this thread, in order (see the module's doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Every torch call in the thread comes through here: the others leave at once, with nothing copied.
        if func is not _SDPA:
            return func(*args, **(kwargs or {}))
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        given = dict(zip(names, args), **(kwargs or {}))
        _no_dropout(given.get("dropout_p", 0.0))
        _count_call()
        _local.direct = direct_sdpa_calls() + 1
        query, key, value = given["query"], given["key"], given["value"]
        # One key head broadcasts over the query's, as torch's own call broadcasts it (transformers 5.0's Falcon)
        if not given.get("enable_gqa", False) and key.shape[1] not in (query.shape[1], 1):
            raise RuntimeError("scaled_dot_product_attention: the query's and the key's heads differ (no enable_gqa)")
        return _call(
            query, key, value, given.get("attn_mask"), bool(given.get("is_causal", False)), False, given.get("scale")
        )


def eager_function(module_type: type):
    """The eager attention a model's modeling file defines (with its soft-capping, sinks...), or None."""
    return getattr(sys.modules.get(module_type.__module__), "eager_attention_forward", None)


@functools.cache
def _attention_functions():
    """transformers' attention functions by name (imported once: an import statement costs every layer's call)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def attend_in_order(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature: [b, h, q, d] in, ([b, q, h, d], None) out."""
    inner_name = inner_implementation(module.config) or "sdpa"
    if not routed_here():  # another thread's pass, outside the mode: the model's own attention, as it asked
        functions = _attention_functions()
        own = eager_function(type(module)) if inner_name == "eager" else functions.get(inner_name)
        if own is not None:
            return own(module, query, key, value, attention_mask, **kwargs)
    _no_dropout(kwargs.get("dropout", 0.0))
    _count_call()
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    # No mask: transformers skipped a mask that is only causal (a text alone, no padding), or the layer attends
    # both ways (`is_causal` False).
    is_causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    out = _call(
        query,
        key,
        value,
        attention_mask,
        causal,
        True,
        kwargs.get("scaling"),
        position_bias=kwargs.get("position_bias"),
        softcap=kwargs.get("softcap"),
        sinks=sinks if isinstance(sinks, torch.Tensor) else None,
        windowed=kwargs.get("sliding_window") is not None,
    )
    return out.transpose(1, 2).contiguous(), None
