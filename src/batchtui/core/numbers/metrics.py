"""Batched-vs-single metrics, computed on the model's device in float32, moved to the host small.

(float64 runs stay in float64: rounding them to float32 would hide the differences they show.)

Inputs are one text's logits at its real positions: `batched` = B_i and `single` = S_i, both
[n, V] in the model's dtype. Only per-position numbers and top-k leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cpu_memory import MMAP_THRESHOLD_MAX
from .logit_rows import LogitRows, rows_differ
from .topk import ordered_topk


def block_elements(device: torch.device | str) -> int:
    """Elements of [n, V] float32 work processed at once: bounds the metrics' temporary memory
    (about 6 float32 copies of a block) whatever the text length. Smaller on the CPU, where a block
    above the allocator's mmap threshold (32 MiB at most) is page-faulted in afresh every time; there a block
    of 16 MiB holds a chunk of 8 texts of 128 tokens over a 4096-token vocabulary, measured as one group (each
    group and block costs its own set of ops, which weigh on a small model)."""
    return 1 << 24 if str(device).startswith("cuda") else 1 << 22


def block_rows(device: torch.device | str, vocab: int) -> int:
    """Positions of [n, V] logits measured as one block (at least one)."""
    return max(1, block_elements(device) // vocab)


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(_wide(tensor.dtype))


@dataclass
class PositionStats:
    """Per-position results on the host; each tensor has n rows. The names are `PositionColumns`' (the
    schema's one declaration), plus two sums the logits' relative L2 is made of. Read-only: columns may share
    one tensor (where no row differs, the batched run's top-k are the single run's)."""

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


def position_stats(
    batched: torch.Tensor | LogitRows, single: torch.Tensor | LogitRows, top_k: int, atol: float, rtol: float
) -> PositionStats:
    """Per-position numbers of [n, V] logits batched and alone (tensors, or rows held where they lie)."""
    batched, single = LogitRows.of(batched), LogitRows.of(single)
    n, vocab = single.shape
    rows = block_rows(single.device, vocab)
    blocks = [
        _block_stats(batched[start : start + rows], single[start : start + rows], top_k, atol, rtol)
        for start in range(0, n, rows)
    ]
    return PositionStats(**on_host(_joined(blocks)))


def _joined(blocks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return blocks[0] if len(blocks) == 1 else {name: torch.cat([block[name] for block in blocks]) for name in blocks[0]}


def on_host(columns: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Columns of n rows ([n] or [n, k]) on the host: as they are where they are on the CPU already, else packed
    (`packed_to_host`)."""
    if all(values.device.type == "cpu" for values in columns.values()):
        return dict(columns)
    return packed_to_host(columns)


def packed_to_host(columns: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The columns copied to the host in one copy: from a GPU each copy waits for the device, and a block's
    seventeen columns (of three dtypes) would wait seventeen times. Their bytes travel together, the widest dtype
    first so that each column's bytes start at a multiple of its element size, and are read back as they were."""
    names = sorted(columns, key=lambda name: -columns[name].element_size())
    raw = [columns[name].contiguous().view(-1).view(torch.uint8) for name in names]
    moved = dict(zip(names, torch.cat(raw).cpu().split([part.numel() for part in raw]), strict=True))
    return {name: moved[name].view(values.dtype).view(values.shape) for name, values in columns.items()}


def _block_stats(batched, single, top_k, atol, rtol) -> dict[str, torch.Tensor]:
    # Each op here reads and writes the whole [rows, V] block, and on a small model that traffic weighs as much
    # as the forward passes. Rows the two runs give bitwise alike (most rows, wherever the kernels agree) need
    # only the single run's side: their differences are 0, their top-k and probabilities the single run's. The
    # rest are measured in full.
    n, vocab = single.shape
    widened = _widened_rows(batched, single)
    if widened is None:  # too large for the CPU's heap to keep: two halves (only where most rows differ)
        halves = ((batched[: n // 2], single[: n // 2]), (batched[n // 2 :], single[n // 2 :]))
        return _joined([_block_stats(b, s, top_k, atol, rtol) for b, s in halves])
    block, rows, squared_single = widened
    del widened
    every = rows.numel() == n  # every row differs (a padded batch on a GPU, say): no copies of rows
    picked = None if every else rows
    k = min(max(top_k, 2), vocab)  # at least 2 for the margin
    top_logits, top_ids = ordered_topk(block, k)  # the same values as the model dtype's, faster to reduce
    margin = top_logits[:n, 0] - top_logits[:n, min(1, k - 1)]
    k = min(top_k, k)
    top_logits, top_ids = top_logits[:, :k], top_ids[:, :k]
    differing = {}
    if rows.numel():
        differing = _difference_stats(picked, block[n:], block[:n], batched.dtype, atol, rtol)
    # The widened values are not read again: on the CPU their log softmax overwrites them (the same numbers, a
    # block less to allocate and fill); elsewhere the block is let go before the KL's temporaries are made.
    log_p = torch.log_softmax(block, dim=-1, out=block) if block.device.type == "cpu" else block.log_softmax(dim=-1)
    del block
    top_probs = log_p.gather(-1, top_ids).exp()
    s_logits, s_ids, s_probs = top_logits[:n], top_ids[:n], top_probs[:n]
    zeros = torch.zeros_like(squared_single)
    stats = {
        "max_abs_diff": zeros,
        "max_abs_diff_ulp": zeros,
        "mean_abs_diff": zeros,
        "kl": zeros,
        "margin": margin,
        "top1_flip": torch.zeros_like(squared_single, dtype=torch.bool),
        "allclose": torch.ones_like(squared_single, dtype=torch.bool),
        "topk_batch_ids": s_ids,
        "topk_batch_logits": s_logits,
        "topk_batch_probs": s_probs,
        "topk_batch_probs_in_single": s_probs,
        "topk_single_ids": s_ids,
        "topk_single_logits": s_logits,
        "topk_single_probs": s_probs,
        "topk_single_probs_in_batch": s_probs,
        "squared_diff": zeros,
        "squared_single": squared_single,
    }
    if not rows.numel():
        return stats
    log_ps, log_pb, b_ids = log_p[:n], log_p[n:], top_ids[n:]
    if not every:
        log_ps, s_ids = log_ps.index_select(0, rows), s_ids[rows]
    differing |= {
        "kl": kl_divergence(differing.pop("delta"), log_ps, zeros.dtype, differing["max_abs_diff"]),
        # Top-1 by value, ties to the smallest id: the same token argmax picks.
        "top1_flip": b_ids[:, 0] != s_ids[:, 0],
        "topk_batch_ids": b_ids,
        "topk_batch_logits": top_logits[n:],
        "topk_batch_probs": top_probs[n:],
        "topk_batch_probs_in_single": log_ps.gather(-1, b_ids).exp(),
        "topk_single_probs_in_batch": log_pb.gather(-1, s_ids).exp(),
    }
    if every:
        return stats | differing
    for name, values in differing.items():
        stats[name] = stats[name].index_put((rows,), values)  # a new tensor: equal rows' share theirs
    return stats


def _widened_rows(batched: LogitRows, single: LogitRows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The single run's rows, then the batched run's rows that differ, widened into one block (one top-k and one
    log softmax then serve both runs: each is a set of ops whatever its rows); the differing rows' indices; the
    single run's squared norms. None where, on the CPU, that block would be glibc's mmap threshold or more: page-
    faulted in afresh each time, it would cost more than measuring the rows in two blocks."""
    n, vocab = single.shape
    differ = rows_differ(batched, single)
    rows = differ.nonzero().flatten()
    wide = _wide(single.dtype)
    if single.device.type == "cpu" and n > 1 and (n + rows.numel()) * vocab * wide.itemsize >= MMAP_THRESHOLD_MAX:
        return None
    block = torch.empty(n + rows.numel(), vocab, dtype=wide, device=single.device)
    squared_single = torch.linalg.vector_norm(single.copy_to(block[:n]), dim=-1).square_()
    # A row with a NaN can be bitwise alike and still not close: non-finite rows are measured in full. (Never the
    # case on a GPU's padded batch, whose rows all differ: no wait for the device to say so.)
    if rows.numel() < n:
        alike_nonfinite = ~torch.isfinite(squared_single) & ~differ
        if alike_nonfinite.any():
            rows = (differ | alike_nonfinite).nonzero().flatten()
            block = torch.cat([block[:n], block.new_empty(rows.numel(), vocab)])
    if rows.numel() == n:
        batched.copy_to(block[n:])
    else:
        batched.select_to(rows, block[n:])
    return block, rows, squared_single


def _difference_stats(rows, b, s, dtype: torch.dtype, atol, rtol) -> dict[str, torch.Tensor]:
    """The differences of the `rows` that differ (None: all rows): `b` their batched logits widened, `s` all the
    single run's, from logits of `dtype`. Their Δ = B - S goes with them, as `delta`, for the KL."""
    s = s if rows is None else s.index_select(0, rows)
    delta = b - s
    diff = delta.abs()
    max_abs = diff.amax(dim=-1)
    largest = torch.maximum(s.amax(dim=-1), s.amin(dim=-1).neg_())  # max |S| per row
    return {
        "max_abs_diff": max_abs,
        "max_abs_diff_ulp": max_abs / ulp(largest, dtype),
        "mean_abs_diff": diff.mean(dim=-1),
        "allclose": allclose_rows(b, s, diff, max_abs, largest, dtype, atol, rtol),
        "squared_diff": torch.linalg.vector_norm(delta, dim=-1).square_(),
        "delta": delta,
    }


def allclose_rows(b, s, diff, max_abs, largest, dtype: torch.dtype, atol: float, rtol: float) -> torch.Tensor:
    """Exactly `torch.isclose(B, S, rtol, atol).all(-1)` (torch.allclose per row) for logits B and S of `dtype`, at a
    fraction of its cost. `b` and `s`: B and S widened (exactly: narrowed back they are the model dtype's values),
    `diff` = |B - S|, `max_abs` and `largest` the row maxima of |B - S| and |S|. Most rows are decided from the
    maxima alone (max|Δ| well within atol: close; well above atol + rtol·max|S|: not); of the rest, every row whose
    worst ratio of error to allowance is off 1 by more than the model dtype's rounding can move it; what is left
    (and any non-finite row) is asked of torch.isclose, in the model's dtype."""
    margin = 16 * torch.finfo(dtype).eps  # the roundings of each side in the model dtype (subnormals too)
    close = max_abs <= atol * (1 - margin)
    far = (max_abs >= (atol + rtol * largest) * (1 + margin)) & torch.isfinite(max_abs)
    undecided = (~close & ~far).nonzero().flatten()
    if undecided.numel():
        allowance = s.index_select(0, undecided).abs_().mul_(rtol).add_(atol)
        worst = (diff.index_select(0, undecided) / allowance).amax(dim=-1)
        close[undecided] = worst <= 1 - margin
        unsure = undecided[(worst > 1 - margin) & ~((worst >= 1 + margin) & torch.isfinite(worst))]
        if unsure.numel():
            in_batch, alone = (x.index_select(0, unsure).to(dtype) for x in (b, s))
            close[unsure] = torch.isclose(in_batch, alone, rtol=rtol, atol=atol).all(dim=-1)
    return close


def kl_divergence(
    delta: torch.Tensor, log_p_single: torch.Tensor, out_dtype: torch.dtype, max_abs: torch.Tensor | None = None
) -> torch.Tensor:
    """KL(softmax S || softmax B) per row from Δ = B - S and log softmax S, with a relative rounding error below
    5e-4 at any size of KL. `max_abs`: max|Δ| per row, where already known.

    With p = exp(log softmax S) and x = Δ - E_p[Δ]: KL = log E[exp x] - E[x] (any centre gives the same KL).
    Low-precision runs are worked out in float32 as log1p(E[expm1 x]), one pass of the vocabulary for each
    reduction: its rounding is at most a few ulp of max|x| and of the centre, and every row where that bound
    could reach 5e-4 of the KL (a shifted distribution, KL at rounding's size, an overflow) is worked out again
    in float64 exactly (`_kl_exact`). A float64 run is worked out exactly throughout.
    """
    if delta.dtype == torch.float64:
        return _kl_exact(delta, log_p_single).to(out_dtype)
    d = delta.float()
    p = log_p_single.float().exp()
    centre = torch.linalg.vecdot(p, d, dim=-1)
    kl = torch.linalg.vecdot(p, (d - centre[:, None]).expm1_(), dim=-1).log1p_()
    largest = d.abs().amax(dim=-1) if max_abs is None else max_abs.float()
    bound = 2 * torch.finfo(torch.float32).eps * (largest + 3 * centre.abs())
    unsure = ~(torch.isfinite(kl) & (bound <= 5e-4 * kl))
    kl.clamp_min_(0.0)
    if bool(unsure.any()):
        rows = unsure.nonzero().flatten()
        kl[rows] = _kl_exact(delta.index_select(0, rows).double(), log_p_single.index_select(0, rows).double()).float()
    return kl.to(out_dtype)


def _kl_exact(d: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """KL per row in float64 as log1p(E[x] + E[x^2 φ(x)]) - E[x], φ(x) = (expm1 x - x) / x^2 (a series for
    small |x|, where the subtraction would cancel). E[x] is 0 up to rounding and cancels exactly in this form,
    also where p sums to 1 only up to its own rounding; E[x^2 φ(x)] is a sum of terms >= 0, so nothing cancels
    there, and KL is 0 only where Δ is the same for every token (softmax B = softmax S). Rows whose exp
    overflows (Δ of hundreds of nats) take the textbook form, which is exact there."""
    p = log_p.exp()
    total = p.sum(dim=-1, keepdim=True)
    x = d - (p * d).sum(dim=-1, keepdim=True) / total
    first = (p * x).sum(dim=-1) / total[:, 0]
    phi = 0.5 + x * (1 / 6 + x * (1 / 24 + x * (1 / 120 + x / 720)))  # within 1e-12 of φ where |x| < 1e-2
    if not bool(x.abs().amax() < 1e-2):  # larger differences: the closed form there
        phi = torch.where(x.abs() < 1e-2, phi, (torch.expm1(x) - x) / x.square())
    rest = (p * x.square_() * phi).sum(dim=-1) / total[:, 0]
    kl = torch.log1p(first + rest) - first
    if not torch.isfinite(kl).all():
        direct = (p * (log_p - (log_p + d).log_softmax(dim=-1))).nansum(dim=-1)
        kl = torch.where(torch.isfinite(kl), kl, direct.clamp_min(0.0))
    return kl.clamp_min_(0.0)


def ulp(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s numbers at `magnitude` (its smallest normal spacing near zero)."""
    info = torch.finfo(dtype)
    # clamp_min to a number, not torch.maximum with a tensor: a GPU would wait for that tensor's copy.
    return torch.exp2(torch.floor(torch.log2(magnitude.clamp_min(info.tiny)))) * info.eps


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float32 (float64 stays float64) over all elements."""
    return (_widened(a) - _widened(b)).abs().max().item() if a.numel() else 0.0


@dataclass
class LayerStats:
    """Per-module results on the host: [modules, texts] tensors."""

    max_abs_diff: torch.Tensor
    rel_l2: torch.Tensor
    bitwise_equal: torch.Tensor


@dataclass
class HiddenRows:
    """The recorded hidden states of one width and dtype, over a group's real positions: [M, N, H] per run, and
    which of the recorded modules (their indices, in run order) the M rows are."""

    modules: list[int]
    batched: torch.Tensor
    single: torch.Tensor


def layer_stats(stacks: list[HiddenRows], lengths: list[int]) -> LayerStats:
    """Hidden states per module, batched vs single, over the real positions of a group's texts.

    `lengths`: each text's positions, the rows being the texts' in turn; every reduction is per (module, text).
    Modules of one width are measured together (an MLP's inner projection is wider than the residual stream).
    """
    longest = max(lengths)
    # Row r of text i goes to place i * longest + r of a [texts, longest] grid: each text's reduction is then one
    # row's, the same sum in the same order every run (a scatter-add on a GPU adds in whatever order its threads
    # finish, and a report could change in its last digits from run to run). Made where the stacks are: a GPU
    # would wait for a copy from the host.
    device = stacks[0].single.device
    places = torch.cat([torch.arange(i * longest, i * longest + n, device=device) for i, n in enumerate(lengths)])
    parts = [_same_width_stats(stack.batched, stack.single, places, len(lengths), longest) for stack in stacks]
    order = [i for stack in stacks for i in stack.modules]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    merged = [torch.cat([getattr(stats, field) for stats in parts])[inverse] for field in _LAYER_FIELDS]
    return LayerStats(*merged)


_LAYER_FIELDS = ("max_abs_diff", "rel_l2", "bitwise_equal")


def _same_width_stats(hb: torch.Tensor, hs: torch.Tensor, places: torch.Tensor, n_texts: int, longest: int):
    # [M, N, H] reduced per text at once, moved to the host once: a host sync per module would stall the device, and
    # per-module ops cost more in dispatch than in math. Only the (module, position) rows that differ are
    # subtracted: most are equal wherever the kernels agree, and add nothing.
    modules = hb.shape[0]

    def per_text(values: torch.Tensor) -> torch.Tensor:  # [M, N] -> [M, texts, longest], 0 (False) past a text's end
        grid = values.new_zeros(modules, n_texts * longest)
        grid[:, places] = values
        return grid.view(modules, n_texts, longest)

    # Bitwise, as the logits' rows are: identical NaNs are alike, 0.0 and -0.0 are not.
    in_batch, alone = hb.flatten(0, 1), hs.flatten(0, 1)  # [M * N, H]: (module, position) rows
    differ = rows_differ(in_batch, alone)
    pairs = differ.nonzero().flatten()  # the (module, position) rows that differ
    differ = differ.view(modules, -1)  # [M, N]
    single_norm = torch.linalg.vector_norm(_widened(hs), dim=-1)  # [M, N]
    max_abs, delta_sq = torch.zeros_like(single_norm), torch.zeros_like(single_norm)
    if pairs.numel():
        delta = _widened(in_batch.index_select(0, pairs)) - _widened(alone.index_select(0, pairs))
        max_abs.view(-1)[pairs] = delta.abs().amax(dim=-1)
        delta_sq.view(-1)[pairs] = delta.square().sum(dim=-1)
    # Summed in float64 and rounded once: a text's sums then do not depend on the longest text it is grouped with
    # (a row's length sets a float32 sum's order, and with it the last digits).
    single_sq, delta_sq = (
        per_text(values).sum(dim=-1, dtype=torch.float64).to(values.dtype)
        for values in (single_norm.square(), delta_sq)
    )
    moved = on_host(
        {
            "max_abs_diff": per_text(max_abs).amax(dim=-1),
            "rel_l2": torch.where(single_sq > 0, delta_sq.sqrt() / single_sq.sqrt(), 0.0),
            "bitwise_equal": ~per_text(differ).any(dim=-1),
        }
    )
    return LayerStats(**moved)
