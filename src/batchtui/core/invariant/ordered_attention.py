"""Attention whose every query is summed in one fixed order, whatever else shares the call.

A fused attention kernel blocks its work by the call's shape: how many queries (one in a decoding step, the whole
prompt in a prefill, prompt and completion in a trainer's forward) and how many keys (the cache's length, a
padded batch's). The same query over the same keys then rounds otherwise in each. Here a query's output depends on
its own query and the keys and values it sees alone:
- where each query sees one span of keys (causal attention, a decoding step, attention both ways, left padding, a
  row of packed sequences), the key its span starts at is moved to place 0, so that a text's keys sit at the same
  places in a batch, alone, in a cache, in a trainer's padded batch and packed behind others (a row whose sequences
  start at several keys takes a pass for each); the keys are taken in tiles of fixed size, each tile's scores and
  weighted values one GEMM of fixed shape with a query's rows computed as in a call of one height, the tiles added
  one after another (`attention_tiles`);
- on CUDA the same spans in one Triton kernel (`triton_kernels`: key blocks of fixed size from the span's first key,
  in order, with an online softmax);
- elsewhere (a sliding window, whose cache drops its oldest keys, so that a key's place moves; a mask with holes)
  every sum is a scan in key order, which a key's place does not enter (`attention_scan`): the same layer takes the
  same way in every pass;
- a softmax's maximum is exact in any order; its exponentials go through the mode's tail-free kernel.
So a text's logits are the same in one forward, decoded over a KV cache, prefilled in chunks, behind a reused
prefix, or in a padded batch of prompt + completion. Under autograd the forward is this, and the backward is the
plain attention's (`invariant.gradients`).
"""

from __future__ import annotations

import torch

from .attention_scan import scanned_attention
from .attention_tiles import tiled_attention
from .compiled_kernels import compiled_attention
from .gpu_kernels import triton_kernels
from .gradients import plain_backward
from .kept_by_identity import KeptByIdentity


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types and float32 work in float32 (a product of two half values is exact there), float64 in itself."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def ordered_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attend: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    windowed: bool = False,
) -> torch.Tensor:
    """[b, h, q, d] attention of `query` [b, h, q, d] over `key`, `value` [b, hk, kv, d] (hk dividing h: grouped
    heads share theirs); `attend`: bool, broadcastable to [b, h, q, kv], which keys each query sees; `bias`: added to
    the scores where given (ALiBi, a float mask), broadcastable likewise; `softcap`: scores capped as
    cap·tanh(s/cap) (Gemma 2); `sinks`: one extra logit per head in every query's softmax, attending nothing
    (gpt-oss); `windowed`: a sliding-window layer (its keys scanned in order, whatever their places). A query that
    sees no key gets zeros."""
    tensors = (query, key, value) + ((bias,) if bias is not None else ()) + ((sinks,) if sinks is not None else ())

    def given(after: tuple) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(bias, sinks) among the tensors after query, key and value."""
        rest = list(after)
        return (rest.pop(0) if bias is not None else None), (rest.pop(0) if sinks is not None else None)

    def run(query, key, value, *rest):
        added, sunk = given(rest)
        return _ordered(query, key, value, attend, scale, added, sunk, softcap, windowed)

    def plain(query, key, value, *rest):
        added, sunk = given(rest)
        return _plain(query, key, value, attend, scale, added, sunk, softcap)

    return plain_backward(run, plain, *tensors)


def _grouped(query: torch.Tensor, key: torch.Tensor) -> tuple[int, int, int, int, int]:
    b, h, q, d = query.shape
    hk, kv = key.shape[1], key.shape[2]
    return b, hk, h // hk, q, kv


def _ordered(query, key, value, attend, scale, bias, sinks, softcap, windowed: bool) -> torch.Tensor:
    b, h, q, _ = query.shape
    kv = key.shape[2]
    work = _work_dtype(query.dtype)
    seen = attend.expand(b, h, q, kv)
    full = None if bias is None else bias.expand(b, h, q, kv)
    compiled = compiled_attention(query)
    if compiled is not None:
        return _compiled(compiled, query, key, value, seen, scale, full, sinks, softcap, work)
    spans = None if windowed else _spans(attend, (b, h, q, kv))
    if spans is None:
        return scanned_attention(query, key, value, seen, scale, full, softcap, sinks, work).to(query.dtype)
    kernels = triton_kernels(query)
    if kernels is not None:
        first, counts = spans
        return kernels.ordered_attention_gpu(query, key, value, _kept_tiles(attend, first, kernels), counts, scale,
                                             full, softcap, sinks)  # fmt: skip
    out = _tiled_passes(query, key, value, _tile_passes(attend, spans), scale, full, softcap, sinks, work)
    return out.to(query.dtype)


def _compiled(op, query, key, value, seen, scale, bias, sinks, softcap, work) -> torch.Tensor:
    """The same attention through the compiled kernel (`compiled_kernels`): one call, every query in key order, the
    tensors read as they are (any strides, their own dtype)."""
    b, h, q, _ = query.shape
    none = query.new_empty(0, dtype=work)
    return op(
        query,
        key.to(query.dtype),
        value.to(query.dtype),
        seen,
        none if bias is None else bias.to(work),
        none if sinks is None else sinks.to(work).reshape(h).contiguous(),
        float(scale),
        float(softcap or 0.0),
        torch.get_num_threads(),
        query.new_empty((b, h, q, value.shape[-1])),
    )


def _from(start: torch.Tensor, t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t` with each row's places from its `start` on moved to place 0 along `dim` (what falls off the end repeats
    the last place: hidden from every query)."""
    n = t.shape[dim]
    index = (start[:, None] + torch.arange(n, device=t.device)).clamp(max=n - 1)  # [b, n]
    shape = [t.shape[0]] + [1] * (t.dim() - 1)
    shape[dim] = n
    return t.gather(dim, index.view(shape).expand(t.shape))


# What is read off a pass's mask, found once for it: the spans each query sees, the Triton kernel's query tiles, the
# tiles' passes.
_kept_spans = KeptByIdentity()
_kept_query_tiles = KeptByIdentity()
_kept_passes = KeptByIdentity()


def _spans(attend: torch.Tensor, shape: tuple) -> tuple | None:
    """(the key each query's span starts at, [b, q]; how many keys each query sees from there, [b, h, q]) where every
    query sees one span of keys, starting at one key in every head; None where one does not (a mask with holes). A
    query that sees no key is given its row's first span's start (it joins its neighbours' tiles)."""
    return _kept_spans.get(attend, shape, lambda: _spanned(attend, shape))


def _spanned(attend: torch.Tensor, shape: tuple) -> tuple | None:
    b, h, q, kv = shape
    attend = attend[(None,) * (4 - attend.dim())]
    seen = attend.expand(attend.shape[0], attend.shape[1], q, kv)  # (a mask shared by the rows or heads: read once)
    counts = seen.sum(-1)
    first = seen.to(torch.uint8).argmax(-1)  # the first key a query sees (0 where it sees none)
    places = torch.arange(kv, device=seen.device)
    span = (places >= first[..., None]) & (places < (first + counts)[..., None])
    if not torch.equal(span, seen):
        return None
    blind = counts == 0
    first = first.masked_fill(blind, kv)
    start = first.amin(1)  # [rows, q]: where the heads' spans start (kv where no head sees a key)
    if not bool(((first == start[:, None]) | blind).all()):
        return None
    start = torch.where(start < kv, start, start.amin(-1, keepdim=True) % kv)  # a blind query: its row's first start
    return start.expand(b, q), counts.expand(b, h, q)


def _kept_tiles(attend: torch.Tensor, first: torch.Tensor, kernels) -> torch.Tensor:
    """The Triton kernel's query tiles (`query_tiles`) for a pass's mask."""
    return _kept_query_tiles.get(attend, tuple(first.shape), lambda: kernels.query_tiles(first))


def _tile_passes(attend: torch.Tensor, spans: tuple) -> list[tuple]:
    """The tiles' passes for a pass's mask (`_passes`)."""
    first, counts = spans
    return _kept_passes.get(attend, tuple(counts.shape), lambda: _passes(first, counts))


def _passes(first: torch.Tensor, counts: torch.Tensor) -> list[tuple]:
    """The tiles' way puts the key a query's span starts at on place 0, one such key a row per pass: a row whose
    queries' spans start at several keys (a packed row's sequences) takes a pass for each, pass i every row's i-th
    start; one pass where each row's spans start at one key (a query that sees nothing has its row's first start,
    `_spans`). Each pass: (each row's start, [b], None where every row's is 0; the queries whose spans start there,
    [b, q]; the first of them and past the last; how many keys each of those sees, [b, h, past - first], 0 for the
    others; the most any of them sees)."""
    b = counts.shape[0]
    ordered = first.sort(-1).values
    new = torch.ones_like(ordered, dtype=torch.bool)  # each row's distinct starts, in order
    new[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    rows, places = new.nonzero(as_tuple=True)
    ranks = (new.cumsum(-1) - 1)[rows, places]
    passes = []
    for i in range(int(new.sum(-1).max())):
        taken = ranks == i
        start = torch.zeros_like(first[:, 0])
        start[rows[taken]] = ordered[rows[taken], places[taken]]
        has = torch.zeros(b, dtype=torch.bool, device=first.device)  # the rows with an i-th start
        has[rows[taken]] = True
        chosen = (first == start[:, None]) & has[:, None]
        columns = chosen.any(0).nonzero().flatten()
        low, high = int(columns[0]), int(columns[-1]) + 1
        seen = counts[:, :, low:high].masked_fill(~chosen[:, None, low:high], 0)
        moved = start if bool(start.any()) else None
        passes.append((moved, chosen, low, high, seen, max(1, int(seen.amax()))))
    return passes


def _tiled_passes(query, key, value, passes, scale, bias, softcap, sinks, work) -> torch.Tensor:
    """The tiles' attention (`attention_tiles`), one pass for each key the rows' spans start at (`_passes`)."""
    b, h, q, _ = query.shape

    def tiled(start, low, high, seen, keys) -> torch.Tensor:
        k, v = (t[:, :, :keys] if start is None else _from(start, t, 2)[:, :, :keys] for t in (key, value))
        added = None if bias is None else (bias if start is None else _from(start, bias, 3))[:, :, low:high, :keys]
        return tiled_attention(query[:, :, low:high], k, v, seen, scale, added, softcap, sinks, work)

    if len(passes) == 1:  # every query's span starts at its row's one start
        start, _, low, high, seen, keys = passes[0]
        return tiled(start, low, high, seen, keys)
    out = query.new_zeros((b, h, q, value.shape[-1]), dtype=work)
    for start, chosen, low, high, seen, keys in passes:
        part = tiled(start, low, high, seen, keys)
        out[:, :, low:high] = torch.where(chosen[:, None, low:high, None], part, out[:, :, low:high])
    return out


def _plain(query, key, value, attend, scale, bias, sinks, softcap) -> torch.Tensor:
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
