"""Rows of logits read where they lie: a group's [N, V] rows as the parts they came in (each text's rows of its
batched chunk, a view; its single run's logits), never copied together first. Each copy of a group's [N, V]
logits in the model's dtype writes and reads them once more, and on a small model the metrics' cost is that
traffic; the metrics widen the rows they read straight into their float32 block instead.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

import torch


class LogitRows:
    """[N, V] rows held as parts ([n_i, V] each, in order) of one dtype and device."""

    def __init__(self, parts: list[torch.Tensor]) -> None:
        self.parts = parts
        self.ends = list(accumulate(part.shape[0] for part in parts))  # where each part's rows end among all

    @classmethod
    def of(cls, rows: torch.Tensor | LogitRows) -> LogitRows:
        return rows if isinstance(rows, LogitRows) else cls([rows])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.ends[-1] if self.ends else 0, self.parts[0].shape[-1])

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    def __getitem__(self, rows: slice) -> LogitRows:
        """Rows start:stop (a block of them, a half), as views of the parts they lie in."""
        start, stop, _ = rows.indices(self.shape[0])
        parts, begin = [], 0
        for part, end in zip(self.parts, self.ends):
            if begin < stop and end > start:
                parts.append(part[max(start - begin, 0) : min(stop, end) - begin])
            begin = end
        return LogitRows(parts or [self.parts[0][:0]])

    def copy_to(self, out: torch.Tensor) -> torch.Tensor:
        """Every row into `out` ([N, V], of its own dtype: widened as they are copied); `out`."""
        for part, end in zip(self.parts, self.ends):
            out[end - part.shape[0] : end].copy_(part)
        return out

    def select_to(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The rows `rows` (ascending) into `out` ([len(rows), V], of its own dtype); `out`. One copy per part
        they lie in."""
        where = rows.tolist()
        begin = 0
        for part, end in zip(self.parts, self.ends):
            first, last = bisect_left(where, begin), bisect_left(where, end)
            if last > first:
                out[first:last].copy_(part.index_select(0, rows[first:last] - begin))
            begin = end
        return out


def rows_differ(a: torch.Tensor | LogitRows, b: torch.Tensor | LogitRows) -> torch.Tensor:
    """[n] bool: rows of two [n, V] tensors of one dtype (or rows held in parts of the same lengths) that are not
    bitwise equal. Compared as the widest integer words a row's bytes divide into: one pass of few wide compares,
    and -0.0 tells from 0.0; each part's flags are written into one tensor, reduced at once."""
    a, b = LogitRows.of(a), LogitRows.of(b)
    n, vocab = a.shape
    row_bytes = vocab * a.dtype.itemsize
    # The largest power of two dividing a row's bytes is at least the element size, a power of two itself.
    word = next(w for w in (torch.int64, torch.int32, torch.int16, torch.uint8) if row_bytes % w.itemsize == 0)
    unequal = torch.empty(n, row_bytes // word.itemsize, dtype=torch.bool, device=a.device)
    for x, y, end in zip(a.parts, b.parts, a.ends, strict=True):
        torch.ne(x.contiguous().view(word), y.contiguous().view(word), out=unequal[end - x.shape[0] : end])
    if unequal.shape[-1] % 8 == 0:  # eight flags to a word: `any` over an eighth as many elements
        unequal = unequal.view(torch.int64)
    return unequal.any(dim=-1)
