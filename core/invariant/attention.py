"""Attention that runs each row of a batch on its real queries and keys only.

A fused attention over a padded length reduces differently from one over the real keys alone, even with the
padding masked out. Here each row's real queries and keys are cut out of the batch, attended as a call of
their own (the same shapes, so the same kernel, as the text alone), and scattered back; padded queries get
zeros. Two ways in, so that attention is caught wherever a model computes it:
- `attend_by_rows`, registered in transformers' `AttentionInterface` (`invariant.routing`; with its mask function in
  `AttentionMaskInterface` under the same name, or transformers would hand it no mask), takes the models that
  attend through the interface and runs the model's own function per row (eager with its soft-capping or
  sinks, or SDPA), the same call for a row in both runs: a row of one query (a decoding step's) attends every real
  key without a mask, a row whose real queries and keys form the square causal mask (a prefill's) goes to SDPA's
  causal kernel with no mask, any other row with its own mask (eager attention always gets the mask); where
  transformers' SDPA function would make one plain SDPA call, the row's call is made directly, without the
  function's checks (`_one_sdpa_call`);
- `RowWiseSdpa`, a torch function mode, takes the `scaled_dot_product_attention` calls a model makes itself
  (every torch call of the thread passes through it, which costs: it is entered only for models that make such
  calls).

Which rows are real is read off the mask: a key is real when a real query attends it, and a query is real
when it attends its own key (the last `q` of the `kv` keys are the queries' own, with or without a cache).
Where transformers skips a mask that is only causal (a text alone with no padding), every query and key is real
and the row's mask is the causal one it would have been (`_unmasked_plan`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from ..errors import NotInvariant
from .routing import inner_implementation, routed_here

_local = threading.local()  # `inside`: a per-row call is running; `calls`: attention calls counted


def attention_calls() -> int:
    """Attention calls this thread has made through the mode (one per attention layer and pass)."""
    return getattr(_local, "calls", 0)


def direct_sdpa_calls() -> int:
    """Of those, the `scaled_dot_product_attention` calls a model made itself, caught by `RowWiseSdpa`."""
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


def _itself_only(q: int, kv: int, device) -> torch.Tensor:
    """[1, 1, q, kv] bool: each of the last q keys attended by its own query alone."""
    return torch.ones(q, dtype=torch.bool, device=device).diag(kv - q)[kv - q :][None, None]


def _count_call() -> None:
    _local.calls = attention_calls() + 1


def _inside(call):
    """`call()` as one row's attention: attention calls it makes are its own, not caught again."""
    outer = getattr(_local, "inside", False)
    _local.inside = True
    try:
        return call()
    finally:
        _local.inside = outer


def _attended(mask: torch.Tensor, kv: int) -> torch.Tensor:
    """[b, q, kv] bool: which key each query attends (any head), from a bool or an additive float mask."""
    mask = mask[..., :kv]
    attend = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return attend.any(dim=1)


class _Span(NamedTuple):
    """A row's real positions along its queries or its keys: how many, and where they are consecutive (padding on one
    side) their first, else their indices (a view and a copy cut a run, where picking indices one by one costs
    several times that)."""

    length: int
    start: int | None
    indices: torch.Tensor | None

    def cut(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """These positions of `t` along `dim`, contiguous."""
        if self.start is None:
            return t.index_select(dim, self.indices)
        return t.narrow(dim, self.start, self.length).contiguous()

    def put(self, target: torch.Tensor, dim: int, values: torch.Tensor) -> None:
        """`values` into these positions of `target` along `dim`."""
        if self.start is None:
            target.index_copy_(dim, self.indices, values)
        else:
            target.narrow(dim, self.start, self.length).copy_(values)


def _spans(real: torch.Tensor) -> list[_Span]:
    """Each row's real positions of `real` ([b, n] bool), found for all rows in a few calls: a decoding step's plan
    is made anew every step."""
    n = real.shape[1]
    as_bytes = real.to(torch.uint8)
    first, last = as_bytes.argmax(1), (n - 1) - as_bytes.flip(1).argmax(1)
    spans = []
    for row, (length, start, end) in enumerate(torch.stack([real.sum(1), first, last], 1).tolist()):
        consecutive = length == 0 or end - start + 1 == length
        spans.append(_Span(length, start, None) if consecutive else _Span(length, None, real[row].nonzero().flatten()))
    return spans


class _Row(NamedTuple):
    """One row's real queries and keys, the [1, 1, q', kv'] bool sub-mask where it has more than one query (one
    query attends every real key: `_row_mask`), and whether that sub-mask is the square causal one (a prefill's: as
    many queries as keys, each attending itself and those before), which SDPA computes without a mask."""

    q: _Span
    k: _Span
    sub: torch.Tensor | None
    causal: bool


# Masks are shared by every layer of a pass (a full and a sliding one at most): their rows are found once.
# Tensors compare element-wise, so the cache holds weak references and matches by identity.
_plans: list[tuple[weakref.ref, tuple[int, int], list]] = []
_PLANS_KEPT = 4


@functools.lru_cache(maxsize=16)
def _unmasked_plan(b: int, q: int, kv: int, causal: str | None, device) -> list[_Row]:
    """Every query and key real in each of `b` rows; `causal`: "start" (SDPA's is_causal aligns the queries to the
    first keys), "end" (transformers' mask, skipped where it is only causal: the queries are the last keys) or
    None (each query attends every key)."""
    sub = torch.ones(q, kv, dtype=torch.bool, device=device)
    if causal is not None:
        sub = sub.tril(0 if causal == "start" else kv - q)
    return [_Row(_Span(q, 0, None), _Span(kv, 0, None), sub[None, None], causal is not None and q == kv)] * b


def _square_causal(sub: torch.Tensor) -> bool:
    """Whether a [q', kv'] bool sub-mask is the square causal one."""
    n = sub.shape[0]
    return n == sub.shape[1] and torch.equal(sub, torch.ones(n, n, dtype=torch.bool, device=sub.device).tril())


def _row_plan(mask: torch.Tensor | None, b: int, q: int, kv: int, causal: str | None, device) -> list[_Row | None]:
    """Per row: its real queries and keys, or None for a row with no real query (`causal`: what no mask means,
    `_unmasked_plan`)."""
    if mask is None:
        return _unmasked_plan(b, q, kv, causal, device)
    for ref, shape, plan in _plans:
        if ref() is mask and shape == (q, kv):
            return plan
    attend = _attended(mask, kv).expand(b, q, kv)
    real_q = attend.diagonal(offset=kv - q, dim1=1, dim2=2)
    real_k = (attend & real_q[:, :, None]).any(dim=1)
    plan: list[_Row | None] = []
    for row, (queries, keys) in enumerate(zip(_spans(real_q), _spans(real_k))):
        if queries.length == 0:
            plan.append(None)
            continue
        sub = None if queries.length == 1 else keys.cut(queries.cut(attend[row], 0), 1)
        # (the mask as a call takes it, made once per plan: a view made per call cost a decoding row's call 5 µs)
        plan.append(
            _Row(queries, keys, None if sub is None else sub[None, None], sub is not None and _square_causal(sub))
        )
    _plans.insert(0, (weakref.ref(mask), (q, kv), plan))
    del _plans[_PLANS_KEPT:]
    return plan


def _row_mask(mask: torch.Tensor | None, row: int, entry: _Row, kv: int) -> tuple[torch.Tensor | None, bool]:
    """The row's own mask: the original's values where it is a float bias (ALiBi), else the bool sub-mask; None
    for one query (a decoding step's), which attends every real key: the call a text alone makes without a mask,
    the kernel's cheapest, in both runs alike. With it, whether the mask is the square causal one, which an SDPA
    call takes as `is_causal` in place of the mask (its causal kernel, several times faster on CPU)."""
    if mask is None or mask.dtype == torch.bool:
        return (None, False) if entry.q.length == 1 else (entry.sub, entry.causal)
    return entry.k.cut(entry.q.cut(mask[..., :kv][row % mask.shape[0]][None], 2), 3), False


def _per_row(query, key, value, mask, causal: str | None, attend, q_dim_of_output: int) -> torch.Tensor:
    """`attend(q, k, v, row_mask, causal)` on each row's real queries and keys (`causal`: the mask is the square
    causal one, `_row_mask`); the outputs stacked where every row's queries are all real (a decoding step's), else
    scattered back into a zero tensor along the output's query dim (2 for [b, h, q, d], 1 for [b, q, h, d])."""
    b, q, kv = query.shape[0], query.shape[2], key.shape[2]
    if mask is not None and mask.dim() < 4:  # SDPA also takes [q, kv] and [b, q, kv] masks
        mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))
    plan = _row_plan(mask, b, q, kv, causal, query.device)
    self_only = getattr(_local, "self_only", False)
    first = plan[0]
    if b == 1 and first is not None and first.q.length == q and first.k.length == kv and not self_only:
        # One row, every query and key real (a text alone): the same call as below without the cutting, its
        # operands laid out as a cut leaves them (contiguous), so the kernel meets the same inputs.
        row_mask, square = _row_mask(mask, 0, first, kv)
        return attend(query.contiguous(), key.contiguous(), value.contiguous(), row_mask, square).contiguous()
    outs = []
    for row, entry in enumerate(plan):
        if entry is None:
            outs.append(None)
            continue
        if self_only:
            row_mask, square = _itself_only(entry.q.length, entry.k.length, query.device), False
        else:
            row_mask, square = _row_mask(mask, row, entry, kv)
        outs.append(
            attend(
                entry.q.cut(query[row : row + 1], 2),
                entry.k.cut(key[row : row + 1], 2),
                entry.k.cut(value[row : row + 1], 2),
                row_mask,
                square,
            )
        )
    if all(entry is not None and entry.q.length == q for entry in plan):  # every query real (a decoding step's)
        return torch.cat(outs)
    out = None
    for row, (entry, row_out) in enumerate(zip(plan, outs)):
        if row_out is None:
            continue
        if out is None:
            shape = list(row_out.shape)
            shape[0], shape[q_dim_of_output] = b, q
            out = row_out.new_zeros(shape)
        entry.q.put(out[row], q_dim_of_output - 1, row_out[0])
    if out is None:  # no real query anywhere: nothing attends, as the original would give for masked rows
        nothing = torch.zeros(1, 1, q, kv, dtype=torch.bool, device=query.device)
        out = attend(query, key, value, nothing, False).zero_()
    return out


_SDPA = torch._C._nn.scaled_dot_product_attention


class RowWiseSdpa(TorchFunctionMode):
    """Every `scaled_dot_product_attention` call in this thread, per row (see the module's doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Every torch call in the thread comes through here: the others leave at once, with nothing copied.
        if func is not _SDPA or getattr(_local, "inside", False):
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        given = dict(zip(names, args), **kwargs)
        query, key, value = given.pop("query"), given.pop("key"), given.pop("value")
        mask, is_causal = given.pop("attn_mask", None), given.pop("is_causal", False)
        _count_call()
        _local.direct = direct_sdpa_calls() + 1

        def attend(q, k, v, row_mask, square):
            return _inside(lambda: func(q, k, v, attn_mask=None if square else row_mask, is_causal=square, **given))

        return _per_row(query, key, value, mask, "start" if is_causal else None, attend, q_dim_of_output=2)


def eager_function(module_type: type):
    """The eager attention a model's modeling file defines (with its soft-capping, sinks...), or None."""
    return getattr(sys.modules.get(module_type.__module__), "eager_attention_forward", None)


# SDPA's own grouped-query heads (`enable_gqa`), from torch 2.5.
_SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def _one_sdpa_call(kwargs: dict) -> bool:
    """Whether transformers' SDPA function, given these keywords, makes one SDPA call and nothing else of them:
    no soft-capping (it refuses it), no position bias, no attention weights asked for. A row's call is then made
    directly (the function's own checks cost a fifth of a decoding row's call on a small model), the same way in
    both runs."""
    return (
        _SDPA_GQA
        and kwargs.get("softcap") is None
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)
    )


def _sdpa_as_transformers_calls_it(q, k, v, mask, square: bool, kwargs: dict) -> torch.Tensor:
    """[b, q, h, d]: the SDPA call transformers' function makes of a row (`_one_sdpa_call`): no mask and causal where
    the row's mask is the square causal one, grouped heads as they are (SDPA's `enable_gqa`, as the function passes
    them with no mask)."""
    mask, dropout, scale = None if square else mask, kwargs.get("dropout", 0.0), kwargs.get("scaling")
    out = _SDPA(q, k, v, mask, dropout, is_causal=square, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


@functools.cache
def _attention_functions():
    """transformers' attention functions by name (imported once: an import statement costs every layer's call)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def attend_by_rows(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature: [b, h, q, d] in, ([b, q, h, d], None) out."""
    functions = _attention_functions()
    inner_name = inner_implementation(module.config) or "sdpa"
    if not routed_here():  # another thread's pass, outside the mode: the model's own attention, as it asked
        own = eager_function(type(module)) if inner_name == "eager" else functions.get(inner_name)
        if own is not None:
            return own(module, query, key, value, attention_mask, **kwargs)
    if inner_name == "eager":
        inner = eager_function(type(module))
        if inner is None:
            raise NotInvariant(
                f"{type(module).__name__} has no eager_attention_forward to run per row: not covered "
                "(run it with --attn sdpa)"
            )
    else:
        inner = functions["sdpa"]  # flash and flex kernels take no per-row masks
    _count_call()
    direct = inner_name != "eager" and _one_sdpa_call(kwargs)

    def attend(q, k, v, row_mask, square):
        # Grouped heads with a mask: the function's own way (on CUDA, SDPA's grouped heads take no mask but in its
        # slowest kernel, and it repeats the keys instead).
        if direct and (square or row_mask is None or q.shape[1] == k.shape[1]):
            return _inside(lambda: _sdpa_as_transformers_calls_it(q, k, v, row_mask, square, kwargs))
        call_kwargs = kwargs
        if inner_name == "eager" and row_mask is not None and row_mask.dtype == torch.bool:  # its mask always
            row_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~row_mask, torch.finfo(q.dtype).min)
        elif square and inner_name != "eager":  # transformers' SDPA reads no mask and more than one query as causal
            row_mask, call_kwargs = None, {**kwargs, "is_causal": True}
        return _inside(lambda: inner(module, q, k, v, row_mask, **call_kwargs)[0])

    # No mask: transformers skipped a mask that is only causal (a text alone, no padding), or the layer attends both
    # ways (`is_causal` False), as its SDPA function would read it.
    is_causal = kwargs.get("is_causal")
    causal = "end" if (getattr(module, "is_causal", True) if is_causal is None else is_causal) else None
    return _per_row(query, key, value, attention_mask, causal, attend, q_dim_of_output=1), None
