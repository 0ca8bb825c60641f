"""Every token's δ = lt − lr, kept on disk as it comes (8 bytes a token, memory flat), for what needs them all:
exact percentiles of |δ| and histograms of δ and of the ratio exp(δ).

A percentile is the nearest rank's value (the ⌈p·n⌉-th smallest |δ|, no interpolation). Up to a chunk of values they
are sorted in memory; past it, found without sorting: a non-negative float64's bits, read as an integer, sort as the
float does, so four passes over the file, each counting the next 16 bits of the values that share the bits found so
far, land on the exact value.
"""

from __future__ import annotations

import math
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterator, Sequence

import torch

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
HISTOGRAM_BINS = 40
_CHUNK = 1 << 20  # values read at a time
_DIGIT_BITS = 16
_DIGIT_MASK = (1 << _DIGIT_BITS) - 1


class DeltaSpill:
    """δ of every token added, in a temporary file that goes with the object."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="batchtui-deltas-")
        self.count = 0

    def add(self, deltas: Sequence[float]) -> None:
        self._file.write(array("d", deltas).tobytes())
        self.count += len(deltas)

    def close(self) -> None:
        self._file.close()

    def _chunks(self) -> Iterator[torch.Tensor]:
        self._file.flush()
        self._file.seek(0)
        while data := self._file.read(_CHUNK * 8):
            yield torch.frombuffer(bytearray(data), dtype=torch.float64)

    def abs_percentiles(self, percents: tuple[float, ...] = PERCENTILES) -> dict[str, float]:
        """{"p50": ..., "p90": ...}: the nearest-rank percentiles of |δ|; empty without tokens."""
        n = self.count
        if not n:
            return {}
        ranks = [max(1, math.ceil(p / 100 * n)) - 1 for p in percents]  # 0-based
        if n <= _CHUNK:  # one chunk: sorted in memory
            ordered = next(self._chunks()).abs().sort().values
            return {_name(p): ordered[rank].item() for p, rank in zip(percents, ranks)}
        found = [0] * len(ranks)  # the bits of each answer found so far, from the top
        for digit in range(64 // _DIGIT_BITS):
            shift = 64 - _DIGIT_BITS * (digit + 1)
            counts = [torch.zeros(1 << _DIGIT_BITS, dtype=torch.int64) for _ in ranks]
            for chunk in self._chunks():
                bits = chunk.abs().view(torch.int64)
                for k, prefix in enumerate(found):
                    shared = bits[(bits >> (shift + _DIGIT_BITS)) == prefix] if digit else bits
                    counts[k] += torch.bincount(
                        (shared >> shift) & ((1 << _DIGIT_BITS) - 1), minlength=1 << _DIGIT_BITS
                    )
            for k, rank in enumerate(ranks):
                below = torch.cumsum(counts[k], 0)
                value = int(torch.searchsorted(below, rank, right=True))
                ranks[k] = rank - (int(below[value - 1]) if value else 0)
                found[k] = (found[k] << _DIGIT_BITS) | value
        values = torch.tensor(found, dtype=torch.int64).view(torch.float64).tolist()
        return {_name(p): v for p, v in zip(percents, values)}

    def histogram(
        self, low: float | None, high: float | None, of: Callable[[torch.Tensor], torch.Tensor]
    ) -> tuple[list, list]:
        """(edges, counts) of `of(δ)` in `HISTOGRAM_BINS` equal bins from `low` to `high` (both included; None where
        no token was scored); an infinite `high` (a ratio past the largest float) is cut to that float, its values in
        the last bin."""
        if not self.count or low is None or high is None:
            return [], []
        high = min(high, sys.float_info.max)
        if high <= low:  # one value: one bin around it
            return [low, high], [self.count]
        counts = torch.zeros(HISTOGRAM_BINS, dtype=torch.int64)
        width = (high - low) / HISTOGRAM_BINS
        for chunk in self._chunks():
            place = ((of(chunk) - low) / width).floor().clamp(0, HISTOGRAM_BINS - 1).to(torch.int64)
            counts += torch.bincount(place, minlength=HISTOGRAM_BINS)
        edges = [low + width * i for i in range(HISTOGRAM_BINS)] + [high]
        return edges, counts.tolist()


def _name(percent: float) -> str:
    return f"p{percent:g}"
