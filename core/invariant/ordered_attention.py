"""Attention whose every query is summed in one fixed order, whatever else shares the call.

A fused attention kernel blocks its work by the call's shape: how many queries (one in a decoding step, the whole
prompt in a prefill, prompt and completion in a trainer's forward) and how many keys (the cache's length, a
padded batch's). The same query over the same keys then rounds otherwise in each. Here every score and every
weighted sum is a sequential sum in a fixed order over the key (or head) dimension, so a query's output depends on
its own query, keys and values alone:
- a score is q·k summed over the head dimension in order (`cumsum`, one value after another, in an accumulator at
  least as wide as float64 on the CPU for float32);
- the softmax's maximum is exact in any order; its exponentials go through the mode's tail-free kernel (a vector
  body and a scalar tail round otherwise);
- the denominator and the weighted sum of values are sums over the keys in order, every masked key adding an exact
  zero: keys hidden from a query (padding, the causal future, outside a sliding window, a cache's empty slots) leave
  its bits as they are, wherever they sit.
So a text's logits are the same in one forward, decoded over a KV cache, prefilled in chunks, behind a reused
prefix, or in a padded batch of prompt + completion. It costs more than the fused kernel on long sequences: the
products are formed before they are summed (in chunks of queries, `_CHUNK_ELEMENTS` at a time).
Under autograd the forward is this, and the backward is the plain attention's (`invariant.gradients`).
"""

from __future__ import annotations

import torch

from .elementwise import tail_free
from .gradients import plain_backward

# At most this many products formed at once (32 MiB of float32): queries are taken in chunks under it.
_CHUNK_ELEMENTS = 1 << 23


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types and float32 work in float32 (a product of two half values is exact there), float64 in itself."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _sum_in_order(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t` summed along `dim` one element after another from the first (a scan's last value): zeros anywhere
    leave the sum's bits as they are, and the order does not depend on the length or the thread count."""
    return t.cumsum(dim).select(dim, -1)


def ordered_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attend: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """[b, h, q, d] attention of `query` [b, h, q, d] over `key`, `value` [b, hk, kv, d] (hk dividing h: grouped
    heads share theirs); `attend`: bool, broadcastable to [b, h, q, kv], which keys each query sees; `bias`: added to
    the scores where given (ALiBi, a float mask), broadcastable likewise; `softcap`: scores capped as
    cap·tanh(s/cap) (Gemma 2); `sinks`: one extra logit per head in every query's softmax, attending nothing
    (gpt-oss). A query that sees no key gets zeros."""
    tensors = (query, key, value) + ((bias,) if bias is not None else ()) + ((sinks,) if sinks is not None else ())

    def run(query, key, value, *rest):
        rest = list(rest)
        given_bias = rest.pop(0) if bias is not None else None
        given_sinks = rest.pop(0) if sinks is not None else None
        return _ordered(query, key, value, attend, scale, given_bias, softcap, given_sinks)

    def plain(query, key, value, *rest):
        rest = list(rest)
        given_bias = rest.pop(0) if bias is not None else None
        given_sinks = rest.pop(0) if sinks is not None else None
        return _plain(query, key, value, attend, scale, given_bias, softcap, given_sinks)

    return plain_backward(run, plain, *tensors)


def _grouped(query: torch.Tensor, key: torch.Tensor) -> tuple[int, int, int, int, int]:
    b, h, q, d = query.shape
    hk, kv = key.shape[1], key.shape[2]
    return b, hk, h // hk, q, kv


def _ordered(query, key, value, attend, scale, bias, softcap, sinks) -> torch.Tensor:
    b, hk, group, q, kv = _grouped(query, key)
    d, dv = query.shape[-1], value.shape[-1]
    work = _work_dtype(query.dtype)
    # [b, hk, group, q, ...]: the queries of the heads sharing one key head side by side
    queries = query.to(work).reshape(b, hk, group, q, 1, d)
    keys = key.to(work).reshape(b, hk, 1, 1, kv, d)
    values = value.to(work).reshape(b, hk, 1, 1, kv, dv)
    h = hk * group
    seen = attend.expand(b, h, q, kv).reshape(b, hk, group, q, kv)
    added = None if bias is None else bias.to(work).expand(b, h, q, kv).reshape(b, hk, group, q, kv)
    extra = None if sinks is None else sinks.to(work).reshape(1, hk, group, 1, 1)
    step = max(1, _CHUNK_ELEMENTS // max(1, b * h * kv * max(d, dv)))
    outs = []
    for start in range(0, q, step):
        part = slice(start, min(q, start + step))
        scores = _sum_in_order(queries[:, :, :, part] * keys, -1) * scale  # [b, hk, group, c, kv]
        if softcap is not None:
            scores = tail_free(torch.tanh, scores / softcap) * softcap
        if added is not None:
            scores = scores + added[:, :, :, part]
        scores = scores.masked_fill(~seen[:, :, :, part], float("-inf"))
        top = scores.amax(-1, keepdim=True)
        if extra is not None:
            top = torch.maximum(top, extra.expand_as(top))
        top = top.masked_fill(torch.isinf(top), 0.0)  # a query that sees nothing: exp(-inf) = 0 everywhere
        weights = tail_free(torch.exp, scores - top)
        total = _sum_in_order(weights, -1)[..., None]
        if extra is not None:
            total = total + tail_free(torch.exp, extra - top)
        summed = _sum_in_order(weights[..., None] * values, -2)  # [b, hk, group, c, dv]
        outs.append(torch.where(total > 0, summed / total, 0.0))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
    return out.reshape(b, h, q, dv).to(query.dtype)


def _plain(query, key, value, attend, scale, bias, softcap, sinks) -> torch.Tensor:
    """The same attention in plain differentiable ops, for the backward pass (not bitwise: `ordered_attention`)."""
    b, hk, group, q, kv = _grouped(query, key)
    keys = key.repeat_interleave(group, dim=1)
    values = value.repeat_interleave(group, dim=1)
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~attend, float("-inf"))
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(b, -1, q, 1).to(scores.dtype)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.matmul(torch.nan_to_num(weights), values)
