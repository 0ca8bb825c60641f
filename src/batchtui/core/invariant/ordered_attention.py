"""Attention whose every query is summed in one fixed order, whatever else shares the call.

A fused attention kernel blocks its work by the call's shape: how many queries (one in a decoding step, the whole
prompt in a prefill, prompt and completion in a trainer's forward) and how many keys (the cache's length, a
padded batch's). The same query over the same keys then rounds otherwise in each. Here a query's output depends on
its own query and the keys and values it sees alone:
- each row's real keys are moved to start at place 0 (a left-padded row's too), so that a text's keys sit at the
  same places in a batch, alone, in a cache and in a trainer's padded batch;
- where each query sees a prefix of them (causal attention, a decoding step, attention both ways), the keys are
  taken in tiles of fixed size, each tile's scores and weighted values one GEMM of fixed shape with a query's rows
  computed as in a call of one height, the tiles added one after another (`attention_tiles`);
- on CUDA, where each query sees a prefix of them, the same in one Triton kernel (`triton_kernels`: key blocks of
  fixed size from the row's first real key, in order, with an online softmax);
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
    kernels = None if windowed else triton_kernels(query)
    spans = None if kernels is None else _spans(attend, (b, h, q, kv), kernels)
    if kernels is not None and spans is not None:
        return kernels.ordered_attention_gpu(query, key, value, *spans, scale, full, softcap, sinks)
    placed = None if windowed else _placement(attend, seen)
    if placed is None:
        out = scanned_attention(query, key, value, seen, scale, full, softcap, sinks, work)
    else:
        start, counts = placed
        if start is not None:  # each row's first real key to place 0 (a left-padded row's)
            key, value = _from(start, key, 2), _from(start, value, 2)
            full = None if full is None else _from(start, full, 3)
        out = tiled_attention(query, key, value, counts, scale, full, softcap, sinks, work)
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


# Where each row's keys start and how many each query sees, found once for a pass's mask.
_placements = KeptByIdentity()


def _placement(attend: torch.Tensor, seen: torch.Tensor) -> tuple | None:
    """(each row's first real key, None where every row's is place 0; how many keys each query sees from there,
    [b, h, q]), where every query sees a prefix of its row's real keys; None where one does not (a mask with holes)."""
    return _placements.get(attend, tuple(seen.shape), lambda: _placed(seen))


def _placed(seen: torch.Tensor) -> tuple | None:
    kv = seen.shape[3]
    real = seen.any(dim=2).any(dim=1)  # [b, kv]: the keys any query of the row sees
    start = real.to(torch.uint8).argmax(1)  # a row's first real key (0 where it has none)
    places = torch.arange(kv, device=seen.device)
    moved = _from(start, seen, 3) & ((start[:, None] + places) < kv)[:, None, None, :]
    counts = moved.sum(-1)
    if not torch.equal(moved, places < counts[..., None]):  # each query: its first `count` keys, none after
        return None
    return (start if bool(start.any()) else None), counts


# The Triton kernel's query tiles and how many keys each query sees, found once for a pass's mask.
_kept_spans = KeptByIdentity()


def _spans(attend: torch.Tensor, shape: tuple, kernels) -> tuple | None:
    """(the Triton kernel's query tiles, `query_tiles`; how many keys each query sees, [b, h, q]) where every query
    sees one span of keys, starting at one key in every head; None where one does not (a mask with holes)."""
    return _kept_spans.get(attend, shape, lambda: _spanned(attend, shape, kernels))


def _spanned(attend: torch.Tensor, shape: tuple, kernels) -> tuple | None:
    b, h, q, kv = shape
    attend = attend[(None,) * (4 - attend.dim())]
    seen = attend.expand(attend.shape[0], attend.shape[1], q, kv)  # (a mask shared by the rows or heads: read once)
    counts = seen.sum(-1)
    first = seen.to(torch.uint8).argmax(-1)  # the first key a query sees (0 where it sees none)
    places = torch.arange(kv, device=seen.device)
    span = (places >= first[..., None]) & (places < (first + counts)[..., None])
    if not torch.equal(span, seen) or not bool((first == first[:, :1]).all()):
        return None
    return kernels.query_tiles(first[:, 0].expand(b, q)), counts.expand(b, h, q)


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
