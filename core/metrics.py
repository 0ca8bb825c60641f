"""Batched-vs-single metrics, computed on the model's device in float32, moved to the host small.

(float64 runs stay in float64: rounding them to float32 would hide the differences they show.)

Inputs are one text's logits at its real positions: `batched` = B_i and `single` = S_i, both
[n, V] in the model's dtype. Only per-position numbers and top-k leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def block_elements(device: torch.device | str) -> int:
    """Elements of [n, V] float32 work processed at once: bounds the metrics' temporary memory
    (about 6 float32 copies of a block) whatever the text length. Smaller on the CPU, where a block
    above the allocator's mmap threshold is page-faulted in afresh every time."""
    return 1 << 24 if str(device).startswith("cuda") else 1 << 21


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float64 else tensor.float()


@dataclass
class PositionStats:
    """Per-position results on the host; each tensor has n rows. The names are `PositionColumns`' (the
    schema's one declaration), plus two sums the logits' relative L2 is made of."""

    max_abs_diff: torch.Tensor  # [n] float32
    max_abs_diff_ulp: torch.Tensor
    mean_abs_diff: torch.Tensor
    kl: torch.Tensor
    margin: torch.Tensor
    top1_flip: torch.Tensor  # [n] bool
    allclose: torch.Tensor  # [n] bool
    topk_batch_ids: torch.Tensor  # [n, k]
    topk_batch_logits: torch.Tensor
    topk_batch_probs: torch.Tensor
    topk_batch_probs_in_single: torch.Tensor  # the same tokens' probabilities in the single run
    topk_single_ids: torch.Tensor
    topk_single_logits: torch.Tensor
    topk_single_probs: torch.Tensor
    topk_single_probs_in_batch: torch.Tensor
    squared_diff: torch.Tensor  # [n] sum over the vocabulary of (B - S)^2, for the logits' relative L2
    squared_single: torch.Tensor  # [n] sum of S^2


def position_stats(batched: torch.Tensor, single: torch.Tensor, top_k: int, atol: float, rtol: float) -> PositionStats:
    n, vocab = single.shape
    rows = max(1, block_elements(single.device) // vocab)
    blocks = [
        _block_stats(batched[start : start + rows], single[start : start + rows], top_k, atol, rtol)
        for start in range(0, n, rows)
    ]
    return PositionStats(**{name: torch.cat([block[name] for block in blocks]).cpu() for name in blocks[0]})


def _block_stats(batched, single, top_k, atol, rtol) -> dict[str, torch.Tensor]:
    # Each op here reads and writes the whole [rows, V] block, and on a small model that traffic weighs as much
    # as the forward passes: few passes, few temporaries, reductions where a tensor would do.
    b = _widened(batched)
    s = _widened(single)
    delta = b - s
    diff = delta.abs()
    max_abs = diff.amax(dim=-1)
    mean_abs = diff.mean(dim=-1)
    squared_diff = torch.linalg.vector_norm(delta, dim=-1).square_()
    largest = torch.maximum(s.amax(dim=-1), s.amin(dim=-1).neg_())  # max |S| per row
    allclose = allclose_rows(batched, single, diff, s, max_abs, largest, atol, rtol)
    del diff
    max_abs_ulp = max_abs / ulp(largest, batched.dtype)
    squared_single = torch.linalg.vector_norm(s, dim=-1).square_()
    lse_b = b.logsumexp(dim=-1, keepdim=True)  # B's probabilities are wanted at its top-k tokens only
    log_ps = s.log_softmax(dim=-1)
    kl = kl_divergence(delta, log_ps, max_abs.dtype)
    del delta
    k = min(max(top_k, 2), s.shape[-1])  # at least 2 for the margin
    b_logits, b_ids = ordered_topk(b, k)
    s_logits, s_ids = ordered_topk(s, k)
    margin = s_logits[:, 0] - s_logits[:, min(1, k - 1)]
    # Top-1 by value, ties to the smallest id: the same token argmax picks.
    flip = b_ids[:, 0] != s_ids[:, 0]
    k = min(top_k, k)
    b_logits, b_ids, s_logits, s_ids = b_logits[:, :k], b_ids[:, :k], s_logits[:, :k], s_ids[:, :k]
    b_probs, b_probs_in_s = (b_logits - lse_b).exp(), log_ps.gather(-1, b_ids).exp()
    s_probs, s_probs_in_b = log_ps.gather(-1, s_ids).exp(), (b.gather(-1, s_ids) - lse_b).exp()
    return {
        "max_abs_diff": max_abs,
        "max_abs_diff_ulp": max_abs_ulp,
        "mean_abs_diff": mean_abs,
        "kl": kl,
        "margin": margin,
        "top1_flip": flip,
        "allclose": allclose,
        "topk_batch_ids": b_ids,
        "topk_batch_logits": b_logits,
        "topk_batch_probs": b_probs,
        "topk_batch_probs_in_single": b_probs_in_s,
        "topk_single_ids": s_ids,
        "topk_single_logits": s_logits,
        "topk_single_probs": s_probs,
        "topk_single_probs_in_batch": s_probs_in_b,
        "squared_diff": squared_diff,
        "squared_single": squared_single,
    }


def allclose_rows(batched, single, diff, s, max_abs, largest, atol: float, rtol: float) -> torch.Tensor:
    """Exactly `torch.isclose(batched, single, rtol, atol).all(-1)` (torch.allclose per row, in the model's own
    dtype) at a fraction of its cost. `diff` = |B - S| and `s` = S widened, `max_abs` and `largest` their row
    maxima. Most rows are decided from the maxima alone (max|Δ| well within atol: close; well above atol +
    rtol·max|S|: not); of the rest, every row whose worst ratio of error to allowance is off 1 by more than the
    model dtype's rounding can move it; what is left (and any non-finite row) is asked of torch.isclose."""
    margin = 16 * torch.finfo(batched.dtype).eps  # the roundings of each side in the model dtype (subnormals too)
    close = max_abs <= atol * (1 - margin)
    far = (max_abs >= (atol + rtol * largest) * (1 + margin)) & torch.isfinite(max_abs)
    rows = (~close & ~far).nonzero().flatten()
    if rows.numel():
        worst = (diff[rows] / s[rows].abs().mul_(rtol).add_(atol)).amax(dim=-1)
        close[rows] = worst <= 1 - margin
        unsure = rows[(worst > 1 - margin) & ~((worst >= 1 + margin) & torch.isfinite(worst))]
        if unsure.numel():
            close[unsure] = torch.isclose(batched[unsure], single[unsure], rtol=rtol, atol=atol).all(dim=-1)
    return close


def kl_divergence(delta: torch.Tensor, log_p_single: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """KL(softmax S || softmax B) per row from Δ = B - S and log softmax S, with a relative rounding error far
    below 1e-3 at any size of KL.

    With p = exp(log softmax S) and x = Δ - E_p[Δ]: KL = log E[exp x] - E[x]
    = log1p(E[x] + E[x^2 φ(x)]) - E[x], φ(x) = (expm1 x - x) / x^2 (a series for small |x|, where the
    subtraction would cancel). E[x] is 0 up to rounding and cancels exactly in this form, also where p sums to
    1 only up to its own rounding; E[x^2 φ(x)] is a sum of terms >= 0, so nothing cancels there, and KL is 0
    only where Δ is the same for every token (softmax B = softmax S). Rows whose exp overflows (Δ of hundreds
    of nats) take the textbook form, which is exact there.

    Computed in float32 first (float64 costs ten times as much on a CPU): the only rounding that matters is
    log1p's, of E[x] + E[x^2 φ], so a row whose |E[x]| + E[x^2 φ] is within 500·KL has a relative error below
    1e-4; the other rows (a shifted distribution, KL at rounding's size, an overflow) are done again in float64.
    """
    if delta.dtype == torch.float64:
        return _kl_in(delta, log_p_single)[0].to(out_dtype)
    kl, first, rest = _kl_in(delta.float(), log_p_single.float())
    unsure = ~(torch.isfinite(kl) & (first.abs() + rest <= 500 * kl))
    unsure &= delta.amax(dim=-1) != delta.amin(dim=-1)  # Δ the same for every token: KL is exactly 0
    if bool(unsure.any()):
        rows = unsure.nonzero().flatten()
        kl[rows] = _kl_in(delta[rows].double(), log_p_single[rows].double())[0].float()
    return kl.to(out_dtype)


def _kl_in(d: torch.Tensor, log_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL per row in the inputs' dtype (float32 or float64), with E[x] and E[x^2 φ(x)] it was made of."""
    p = log_p.exp()
    total = p.sum(dim=-1)
    x = d - (torch.linalg.vecdot(p, d, dim=-1) / total)[:, None]
    first = torch.linalg.vecdot(p, x, dim=-1) / total
    # E[x^2 φ(x)] = E[expm1(x)] - E[x]: the sum loses digits where |x| is small (at most 2 ulp of |x| per
    # token); a row where that loss could reach 1e-4 of it takes the series of φ instead, term by term, where
    # |x| < 1e-2 (within 1e-12 of φ there).
    rest = torch.linalg.vecdot(p, torch.expm1(x), dim=-1) / total - first
    loss = 2 * torch.finfo(x.dtype).eps * torch.linalg.vecdot(p, x.abs(), dim=-1) / total
    rows = (loss > 1e-4 * rest.abs()).nonzero().flatten()
    if rows.numel():
        xs = x[rows]
        series = (xs / 720).add_(1 / 120).mul_(xs).add_(1 / 24).mul_(xs).add_(1 / 6).mul_(xs).add_(0.5)
        terms = torch.where(xs.abs() < 1e-2, series.mul_(xs).mul_(xs), torch.expm1(xs).sub_(xs))
        rest[rows] = torch.linalg.vecdot(p[rows], terms, dim=-1) / total[rows]
    kl = torch.log1p(first + rest) - first
    if not torch.isfinite(kl).all():
        direct = (p * (log_p - (log_p + d).log_softmax(dim=-1))).nansum(dim=-1)
        kl = torch.where(torch.isfinite(kl), kl, direct.clamp_min(0.0))
    return kl.clamp_min_(0.0), first, rest


def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s numbers at `magnitude` (its smallest normal spacing near zero)."""
    info = torch.finfo(dtype)
    floor = torch.as_tensor(info.tiny, dtype=magnitude.dtype, device=magnitude.device)
    return torch.exp2(torch.floor(torch.log2(torch.maximum(magnitude, floor)))) * info.eps


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float32 (float64 stays float64) over all elements."""
    return (_widened(a) - _widened(b)).abs().max().item() if a.numel() else 0.0


def ordered_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim of [n, V], by value descending and then token id ascending.

    torch.topk leaves the order of tied values (common in bf16 logits) unspecified, and with
    it which tied token makes the cut; that would show rank changes that are not there.
    """
    if k >= x.shape[-1]:
        return _order(x, torch.arange(x.shape[-1], device=x.device).expand_as(x))
    values, ids = x.topk(k + 1, dim=-1)
    ids = ids[..., :k].clone()
    # Only rows where the k-th value ties the next one need the exact cut: redo just those.
    tied_rows = (values[..., k - 1] == values[..., k]).nonzero().flatten()
    if tied_rows.numel():
        ids[tied_rows] = _tie_aware_cut(x[tied_rows], k)
    return _order(x, ids)


def _tie_aware_cut(x: torch.Tensor, k: int) -> torch.Tensor:
    """The ids of the top k, taking the smallest ids among those tied with the k-th value."""
    kth = x.topk(k, dim=-1).values[..., -1:]
    above = x > kth
    tied = x == kth
    needed = k - above.sum(dim=-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(dim=-1) <= needed))
    return torch.where(chosen, x, torch.finfo(x.dtype).min).topk(k, dim=-1).indices


def _order(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen ids sorted by value descending, ties by id ascending (a stable sort of sorted ids)."""
    ids = ids.sort(dim=-1).values
    values, order = x.gather(-1, ids).sort(dim=-1, descending=True, stable=True)
    return values, ids.gather(-1, order)


@dataclass
class LayerStats:
    """Per-module results on the host: [modules, texts] tensors."""

    max_abs_diff: torch.Tensor
    rel_l2: torch.Tensor
    bitwise_equal: torch.Tensor


def layer_stats(
    batched: list[torch.Tensor], single: list[torch.Tensor], segments: torch.Tensor, n_texts: int
) -> LayerStats:
    """Hidden states [N, H] per module, batched vs single, over the real positions of a chunk's texts.

    `segments` [N] names each row's text; every reduction is per (module, text). Modules of one width
    are measured together (an MLP's inner projection is wider than the residual stream).
    """
    by_width: dict[int, list[int]] = {}
    for index, hidden in enumerate(batched):
        by_width.setdefault(hidden.shape[-1], []).append(index)
    parts = {
        tuple(indices): _same_width_stats(
            [batched[i] for i in indices], [single[i] for i in indices], segments, n_texts
        )
        for indices in by_width.values()
    }
    order = [i for indices in parts for i in indices]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    merged = [torch.cat([getattr(stats, field) for stats in parts.values()])[inverse] for field in _LAYER_FIELDS]
    return LayerStats(*merged)


_LAYER_FIELDS = ("max_abs_diff", "rel_l2", "bitwise_equal")


def _same_width_stats(batched, single, segments, n_texts) -> LayerStats:
    # Stacked over modules and reduced per text with scatter ops, moved to the host once: a host
    # sync per module would stall the device, and per-module ops cost more in dispatch than in math.
    hb = torch.stack(batched)
    hs = torch.stack(single)
    unequal = (hb != hs).any(dim=-1).to(torch.int32)  # [M, N]
    hb, hs = _widened(hb), _widened(hs)
    delta = hb - hs
    index = segments.expand(hb.shape[0], -1)
    shape = (hb.shape[0], n_texts)

    def per_text(values: torch.Tensor, reduce: str) -> torch.Tensor:
        out = values.new_zeros(shape)
        return out.scatter_reduce_(1, index, values, reduce=reduce, include_self=True)

    max_abs = per_text(delta.abs().amax(dim=-1), "amax")
    delta_sq = per_text(delta.square().sum(dim=-1), "sum")
    single_sq = per_text(hs.square().sum(dim=-1), "sum")
    rel_l2 = torch.where(single_sq > 0, delta_sq.sqrt() / single_sq.sqrt(), 0.0)
    equal = per_text(unequal, "amax") == 0
    return LayerStats(max_abs_diff=max_abs.cpu(), rel_l2=rel_l2.cpu(), bitwise_equal=equal.cpu())
