"""Attention with every sum a scan in key order (`cumsum`): a key a query does not see adds an exact zero wherever it
sits, so a query's bits depend only on the order of the keys it sees, not on their places. The way for layers whose
keys sit at other places in other passes (a sliding window's cache drops its oldest keys) and for masks with holes;
it forms every product before summing (in chunks of queries), several times the tiles' cost (`attention_tiles`)."""

from __future__ import annotations

import torch

from .elementwise import tail_free

# At most this many products formed at once (32 MiB of float32): queries are taken in chunks under it.
_CHUNK_ELEMENTS = 1 << 23


def sum_in_order(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t` summed along `dim` one element after another from the first (a scan's last value, in float64 for float32
    on the CPU): zeros anywhere leave the sum's bits as they are, and the order does not depend on the length or the
    thread count."""
    return t.cumsum(dim).select(dim, -1)


def scanned_attention(query, key, value, seen, scale, bias, softcap, sinks, work) -> torch.Tensor:
    """[b, h, q, dv] from [b, h, q, d] queries over [b, hk, kv, d] keys and values; `seen`, `bias`: [b, h, q, kv]."""
    b, h, q, d = query.shape
    hk, kv, dv = key.shape[1], key.shape[2], value.shape[-1]
    group = h // hk
    # [b, hk, group, q, ...]: the queries of the heads sharing one key head side by side
    queries = query.to(work).reshape(b, hk, group, q, 1, d)
    keys = key.to(work).reshape(b, hk, 1, 1, kv, d)
    values = value.to(work).reshape(b, hk, 1, 1, kv, dv)
    seen = seen.reshape(b, hk, group, q, kv)
    added = None if bias is None else bias.to(work).reshape(b, hk, group, q, kv)
    extra = None if sinks is None else sinks.to(work).reshape(1, hk, group, 1, 1)
    step = max(1, _CHUNK_ELEMENTS // max(1, b * h * kv * max(d, dv)))
    outs = []
    for start in range(0, q, step):
        part = slice(start, min(q, start + step))
        scores = sum_in_order(queries[:, :, :, part] * keys, -1) * scale  # [b, hk, group, c, kv]
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
        total = sum_in_order(weights, -1)[..., None]
        if extra is not None:
            total = total + tail_free(torch.exp, extra - top)
        summed = sum_in_order(weights[..., None] * values, -2)  # [b, hk, group, c, dv]
        outs.append(torch.where(total > 0, summed / total, 0.0))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
    return out.reshape(b, h, q, dv)
