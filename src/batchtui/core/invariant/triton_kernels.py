"""The mode's CUDA kernels, in Triton: a product of rows and an operand, and attention, each summed in one fixed order
whatever the call's shape (the GPU's counterpart of `compiled_kernels`' C++).

cuBLAS and the fused attention kernels pick a kernel, its tiles and a split of the sum by the call's shape: a
decoding step's one row, a prefill's hundreds and a trainer's padded batch go to other kernels, which round
otherwise. Here one configuration serves every call, as batch-invariant kernels elsewhere do:
- `fixed_order_matmul`: each output is the sum over k in blocks of `_BLOCK_K`, block after block from the first, by
  one program (no split of k, whatever the rows); the rows are cut into tiles of `_BLOCK_M`, and a row's value
  depends on its own row and the operand only. float32 in IEEE precision (no TF32: the library's default);
- `ordered_attention_gpu`: each query sees a span of keys (`first`, `counts`: causal, a decoding step, both ways, a
  left-padded row, a sequence packed behind others alike), taken from the span's first key in blocks of `_BLOCK_KV`,
  in order, with an online softmax; the block its keys end in masked past them, blocks past them adding exactly
  nothing. The queries are cut into tiles of queries whose spans start at one key (`query_tiles`), so that a key
  sits at the same place of its block for every query. So a query's output is the same in a prefill, a decoding
  step over a cache, a chunk, a padded batch and a packed row.

Triton's interpreter runs the same kernels on CPU tensors where `TRITON_INTERPRET=1` is set before triton is
imported (the tests, on a machine without CUDA), with two differences: it multiplies half-precision tiles as their
integer bits and rounds float32 to bfloat16 by cutting, so there the tiles are widened to float32 first (`WIDEN`: a
GPU's products of two bfloat16 values are exact in float32 all the same) and the result is written in float32 and
rounded by torch (`_written`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

_BLOCK_M, _BLOCK_N, _BLOCK_K = 64, 64, 32
_BLOCK_Q, _BLOCK_KV = 16, 32
_WARPS, _STAGES = 4, 2
_PRECISION = {torch.float32: "ieee", torch.bfloat16: "tf32", torch.float16: "tf32"}  # (tf32: unused for half types)
DTYPES = tuple(_PRECISION)


# (the rows' count never specialized: a call of one row is the same compiled kernel as one of many)
@triton.jit(do_not_specialize=["M"])
def _fixed_order_mm(
    a, b, bias, out, M, N, K,
    a_batch, a_row, a_k, b_batch, b_k, b_col, o_batch, o_row, o_col,
    HAS_BIAS: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    row_ptrs = a + batch * a_batch + rows[:, None].to(tl.int64) * a_row
    col_ptrs = b + batch * b_batch + cols[None, :].to(tl.int64) * b_col
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # k's blocks in order, every one by this program
        k = k0 + ks
        x = tl.load(row_ptrs + k[None, :] * a_k, mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(col_ptrs + k[:, None] * b_k, mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
        if WIDEN:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)
    o = out + batch * o_batch + rows[:, None].to(tl.int64) * o_row + cols[None, :] * o_col
    tl.store(o, acc.to(out.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["KV"])
def _ordered_attention(
    q, k, v, tiles, counts, bias, sinks, out,
    GROUP, D, DV, KV,
    q_b, q_h, q_q, q_d, k_b, k_h, k_k, k_d, v_b, v_h, v_k, v_d,
    c_b, c_h, c_q, bias_b, bias_h, bias_q, bias_k, o_b, o_h, o_q, o_d,
    scale, softcap,
    HAS_BIAS: tl.constexpr, HAS_SINKS: tl.constexpr, SOFTCAP: tl.constexpr, WIDEN: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    tile = tiles + tl.program_id(0) * 4  # (row, first query, queries, the key their spans start at)
    b, q0, n, first = tl.load(tile).to(tl.int64), tl.load(tile + 1), tl.load(tile + 2), tl.load(tile + 3)
    h = tl.program_id(1)
    kh = h // GROUP
    qs = q0 + tl.arange(0, BLOCK_Q)
    ds, dvs, places = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV), tl.arange(0, BLOCK_KV)
    query_mask = qs < q0 + n
    query = tl.load(
        q + b * q_b + h * q_h + qs[:, None] * q_q + ds[None, :] * q_d,
        mask=query_mask[:, None] & (ds[None, :] < D),
        other=0.0,
    )
    seen = tl.load(counts + b * c_b + h * c_h + qs * c_q, mask=query_mask, other=0)  # keys each query sees
    if WIDEN:
        query = query.to(tl.float32)
    if HAS_SINKS:  # the sink's logit starts the softmax: exp(sink - sink) = 1
        top = tl.zeros((BLOCK_Q,), dtype=tl.float32) + tl.load(sinks + h).to(tl.float32)
        total = tl.full((BLOCK_Q,), 1.0, dtype=tl.float32)
    else:
        top = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_Q, BLOCK_DV), dtype=tl.float32)
    for k0 in range(0, tl.max(seen, axis=0), BLOCK_KV):
        place = k0 + places
        at = first + place
        there = at < KV
        keys = tl.load(
            k + b * k_b + kh * k_h + at[None, :] * k_k + ds[:, None] * k_d,
            mask=there[None, :] & (ds[:, None] < D),
            other=0.0,
        )
        values = tl.load(
            v + b * v_b + kh * v_h + at[:, None] * v_k + dvs[None, :] * v_d,
            mask=there[:, None] & (dvs[None, :] < DV),
            other=0.0,
        )
        if WIDEN:
            keys, values = keys.to(tl.float32), values.to(tl.float32)
        scores = tl.dot(query, keys, input_precision=PRECISION) * scale
        if SOFTCAP:  # cap * tanh(s / cap), tanh from exp (Triton's interpreter has no libdevice)
            scores = softcap * (1.0 - 2.0 / (tl.exp(2.0 * (scores / softcap)) + 1.0))
        if HAS_BIAS:
            scores += tl.load(
                bias + b * bias_b + h * bias_h + qs[:, None] * bias_q + at[None, :] * bias_k,
                mask=query_mask[:, None] & there[None, :],
                other=0.0,
            ).to(tl.float32)
        scores = tl.where(place[None, :] < seen[:, None], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, axis=1))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a query that has seen nothing yet
        weights = tl.exp(scores - shift[:, None])
        kept = tl.exp(top - shift)
        total = total * kept + tl.sum(weights, axis=1)
        acc = acc * kept[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=PRECISION)
        top = new_top
    result = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
    tl.store(
        out + b * o_b + h * o_h + qs[:, None] * o_q + dvs[None, :] * o_d,
        result.to(out.dtype.element_ty),
        mask=query_mask[:, None] & (dvs[None, :] < DV),
    )


def _interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (`TRITON_INTERPRET=1` where triton was imported)."""
    return not isinstance(_fixed_order_mm, JITFunction)


def _written(like: torch.Tensor, shape: tuple) -> torch.Tensor:
    """Where a kernel writes its result: in `like`'s dtype, or float32 under the interpreter (the module's doc)."""
    return like.new_empty(shape, dtype=torch.float32 if _interpreted() else like.dtype)


def fixed_order_matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`a @ b (+ bias)` in `a`'s dtype: [m, k] by [k, n], or batched [s, m, k] by [s, k, n]; any strides; `bias` one
    value per output column. Every row's bits are those it gets in a call of any other height."""
    batched = a.dim() == 3
    a3, b3 = (a, b) if batched else (a[None], b[None])
    s, m, k = a3.shape
    n = b3.shape[2]
    out = _written(a3, (s, m, n))
    if out.numel() == 0:
        return out.to(a.dtype) if batched else out[0].to(a.dtype)
    grid = (triton.cdiv(m, _BLOCK_M), triton.cdiv(n, _BLOCK_N), s)
    _fixed_order_mm[grid](
        a3, b3, a3 if bias is None else bias, out, m, n, k,
        *a3.stride(), *b3.stride(), *out.stride(),
        HAS_BIAS=bias is not None, WIDEN=_interpreted(), PRECISION=_PRECISION[a.dtype],
        BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K, num_warps=_WARPS, num_stages=_STAGES,
    )  # fmt: skip
    out = out.to(a.dtype)
    return out if batched else out[0]


def query_tiles(first: torch.Tensor) -> torch.Tensor:
    """[tiles, 4] int32 (row, first query, queries, the key their spans start at): each row's queries cut where the
    key their span starts at changes (a packed row's sequences), then into tiles of at most `_BLOCK_Q`. `first`:
    [b, q], the key each query's span starts at."""
    b, q = first.shape
    places = torch.arange(q, device=first.device).expand(b, q)
    changes = torch.ones_like(first, dtype=torch.bool)
    changes[:, 1:] = first[:, 1:] != first[:, :-1]
    begins = torch.where(changes, places, 0).cummax(dim=1).values  # where each query's run of one start begins
    ends = torch.where(changes.roll(-1, 1) | (places == q - 1), places + 1, q).flip(1).cummin(dim=1).values.flip(1)
    rows, starts = torch.nonzero((places - begins) % _BLOCK_Q == 0, as_tuple=True)
    counts = torch.minimum(ends[rows, starts] - starts, torch.tensor(_BLOCK_Q, device=first.device))
    return torch.stack([rows, starts, counts, first[rows, starts]], dim=1).to(torch.int32).contiguous()


def ordered_attention_gpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tiles: torch.Tensor,
    counts: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """[b, h, q, dv] in the query's dtype from [b, h, q, d] queries over [b, hk, kv, d] keys and values (hk dividing
    h), each query seeing `counts` ([b, h, q]) keys from the one its tile's spans start at (`tiles`: `query_tiles`);
    `bias`: [b, h, q, kv] (any strides: an expanded one reads as it is) added to the scores; `sinks`: [h] extra
    logits. A query that sees no key gets zeros (or, with sinks, zeros too: the sink attends nothing)."""
    b, h, q, d = query.shape
    hk, kv, dv = key.shape[1], key.shape[2], value.shape[-1]
    key, value = key.to(query.dtype), value.to(query.dtype)
    counts = counts.to(torch.int32)  # (its strides after the conversion: an expanded one comes back whole)
    out = _written(query, (b, h, q, dv))
    if tiles.shape[0] == 0 or h == 0:
        return out.to(query.dtype)
    no_bias = (0, 0, 0, 0)
    _ordered_attention[(tiles.shape[0], h)](
        query, key, value, tiles, counts,
        query if bias is None else bias, query if sinks is None else sinks.reshape(h), out,
        h // hk, d, dv, kv,
        *query.stride(), *key.stride(), *value.stride(), *counts.stride(),
        *(no_bias if bias is None else bias.stride()), *out.stride(),
        float(scale), float(softcap or 1.0),
        HAS_BIAS=bias is not None, HAS_SINKS=sinks is not None, SOFTCAP=softcap is not None,
        WIDEN=_interpreted(), PRECISION=_PRECISION[query.dtype], BLOCK_Q=_BLOCK_Q, BLOCK_KV=_BLOCK_KV,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(dv)),
        num_warps=_WARPS, num_stages=_STAGES,
    )  # fmt: skip
    return out.to(query.dtype)
