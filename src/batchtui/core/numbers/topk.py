"""Top-k of logits in a fixed order: by value descending, then token id ascending.

torch.topk leaves the order of tied values unspecified, and with it which tied token makes the cut; bf16 logits tie
often, and a rank change that is only topk's choice would show as a disagreement that is not there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def ordered_topk(x: torch.Tensor, k: int, spare: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim of [n, V]: (values, ids), by value descending and then token id ascending.
    `spare`: how many more than k are picked to settle a tie at the cut (by default the device's)."""
    if k >= x.shape[-1]:
        return _order(x, torch.arange(x.shape[-1], device=x.device).expand_as(x))
    # A few more than k, ordered: a tie at the cut that ends inside them is settled there. On a GPU, where each
    # top-k and cut is some twenty kernel launches and a block of 151,936-token rows has a tie at the cut nearly every
    # time, the window is wide enough to hold such ties. On the CPU three more: with one more, one row in twelve of
    # bf16 logits over 4,096 tokens had a tie running to the window's end and took the cut (a top-5 of 640 rows:
    # 1.49-1.75 ms, 1.35-1.65 ms with three more, whose wider pick costs less than the cuts it spares).
    if spare is None:
        spare = 16 if x.device.type != "cpu" else 3
    window = min(k + spare, x.shape[-1])
    top = _top(x, window)
    values, ids = (part[..., :k] for part in _order(x, top.ids))
    if window == x.shape[-1]:
        return values, ids
    # Only rows where the ties at the k-th value run to the window's end need the exact cut: redo just those.
    tied_rows = (top.values[..., -1] == values[..., k - 1]).nonzero().flatten()
    if tied_rows.numel():
        kth = values[tied_rows, k - 1 : k]
        # Every token above the k-th value is a candidate; so is every token equal to it unless a block left out
        # reaches it: the cut is then made among the candidates, not over the whole row.
        among = torch.zeros_like(tied_rows, dtype=torch.bool)
        if top.beyond is not None:
            among = top.beyond[tied_rows] < kth[:, 0]
        cut = ids[tied_rows]
        if among.any():
            candidates = top.candidates(tied_rows[among])
            cut[among] = _tie_aware_cut(x[tied_rows[among, None], candidates], kth[among], k, candidates, x.shape[-1])
        if not among.all():
            cut[~among] = _tie_aware_cut(x[tied_rows[~among]], kth[~among], k)
        values[tied_rows], ids[tied_rows] = _order(x, cut, tied_rows)
    return values, ids


@dataclass
class _Top:
    """x.topk(k)'s values and ids, and where they were picked from: the first id of each block of `width` ids they
    were picked among ([n, B], None where the whole row was), how many ids those blocks hold (the last one may be
    partial), and the largest value outside them ([n])."""

    values: torch.Tensor
    ids: torch.Tensor
    starts: torch.Tensor | None = None
    width: int = 0
    count: int = 0
    beyond: torch.Tensor | None = None

    def candidates(self, rows: torch.Tensor) -> torch.Tensor:
        """The ids picked among, of the given rows: [r, count]."""
        assert self.starts is not None  # (candidates are asked of a top-k picked in blocks)
        offsets = torch.arange(self.width, device=self.starts.device)
        return (self.starts[rows, :, None] + offsets).flatten(-2)[:, : self.count]


def _top(x: torch.Tensor, k: int) -> _Top:
    """x.topk(k) along the last dim: the same values, and the same ids wherever the k-th value is not tied.

    torch's CPU top-k copies each row into a queue of (value, id) pairs first, which over a real vocabulary
    costs several times a pass of the row. A row's k largest lie in its k blocks of largest maxima (an element
    outside them is at most the least of those maxima, each of which is at least as large as it): the blocks'
    maxima are one cheap reduction, and top-k then runs over the maxima and k blocks. NaN, the largest for
    topk, is the largest maximum too. On the CPU only, where it was measured (CUDA's top-k is another kernel)."""
    vocab = x.shape[-1]
    # The width balances the two top-k calls' sizes, and is at least 64: a row of 64·k candidates or more takes
    # ATen's partial-sort path, several times faster than its nth_element path on a row this short.
    width = max(64, 1 << round(math.log2(math.sqrt(vocab / k))))
    blocks = vocab // width
    if x.device.type != "cpu" or blocks < 4 * k:
        return _Top(*x.topk(k, dim=-1))
    n = x.shape[0]
    maxima = x[:, : blocks * width].unflatten(-1, (blocks, width)).amax(dim=-1)
    largest = maxima.topk(k + 1, dim=-1)  # the (k+1)-th: the largest value outside the chosen blocks
    starts = largest.indices[:, :k] * width
    # The chosen blocks copied out whole, as rows of a view of every `width` consecutive values (one copy a block:
    # several times faster than a gather of each value by its own id).
    step = math.gcd(vocab, width)
    windows = x.contiguous().flatten().unfold(0, width, step)
    first = (torch.arange(n, device=x.device)[:, None] * vocab + starts) // step
    picked = torch.index_select(windows, 0, first.flatten()).view(n, k * width)
    if blocks * width < vocab:  # the last, partial block is always a candidate
        picked = torch.cat([picked, x[:, blocks * width :]], dim=-1)
        starts = torch.cat([starts, starts.new_full((n, 1), blocks * width)], dim=-1)
    values, where = picked.topk(k, dim=-1)
    ids = starts.gather(-1, where.div(width, rounding_mode="floor")).add_(where % width)
    return _Top(values, ids, starts, width, picked.shape[-1], largest.values[:, k])


def _tie_aware_cut(
    x: torch.Tensor, kth: torch.Tensor, k: int, ids: torch.Tensor | None = None, vocab: int = 0
) -> torch.Tensor:
    """The ids of the top k of rows whose k-th value `kth` ([r, 1]) is tied: those above it, then the smallest ids
    among those equal to it. One int32 key per token ranks them so (NaN above all, as topk has it). `x`: whole rows,
    or the values of the tokens `ids` ([r, C]) of a vocabulary of `vocab`."""
    if x.dtype != torch.float64:  # float32 compares run faster than bf16's
        x, kth = x.float(), kth.float()
    if ids is None:
        vocab = x.shape[-1]
        by_id = torch.arange(vocab - 1, -1, -1, dtype=torch.int32, device=x.device)  # the smaller id, the larger key
    else:
        by_id = (vocab - 1 - ids).to(torch.int32)
    key = (x <= kth).to(torch.int32).mul_(-vocab).add_(vocab).add_(by_id)
    chosen = key.masked_fill_(x < kth, -1).topk(k, dim=-1).indices
    return chosen if ids is None else ids.gather(-1, chosen)


def _order(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen ids sorted by value descending, ties by id ascending (a stable sort of sorted ids). `rows`: the
    rows of x the ids are of, where not all."""
    ids = ids.sort(dim=-1).values
    chosen = x.gather(-1, ids) if rows is None else x[rows[:, None], ids]
    values, order = chosen.sort(dim=-1, descending=True, stable=True)
    return values, ids.gather(-1, order)
