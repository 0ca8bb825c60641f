"""The summary of the sequences scored so far, added one record at a time in the plan's order (a resumed run adds the
records read back first, then the new ones: the same additions in the same order as an uninterrupted run)."""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable

import torch

from ..numbers.importance import DEFAULTS, Correction, ImportanceTally
from ..numbers.rollouts_summary import DeltaBand, Histogram, RolloutsSummary, ScoredToken, WorstSequence, WorstToken
from .deltas import DeltaSpill
from .records import Record

WORST = 10  # sequences and tokens listed
# The bands |δ| is given over: a token's place in its completion, and the trainer's entropy there (nats).
POSITION_EDGES = (0, 16, 64, 256, 1024, math.inf)
ENTROPY_EDGES = (0.0, 0.1, 0.5, 1.0, 2.0, 4.0, math.inf)


class _Bands:
    """|δ| summed and its largest kept per band of `edges` ([edges[i], edges[i + 1]))."""

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.tokens = [0] * (len(edges) - 1)
        self.sums = [0.0] * (len(edges) - 1)
        self.tops = [0.0] * (len(edges) - 1)

    def add(self, where: float, size: float) -> None:
        band = bisect.bisect_right(self.edges, where) - 1
        band = min(max(band, 0), len(self.tokens) - 1)
        self.tokens[band] += 1
        self.sums[band] += size
        self.tops[band] = max(self.tops[band], size)

    def bands(self) -> tuple[DeltaBand, ...]:
        return tuple(
            DeltaBand(self.edges[i], self.edges[i + 1], n, self.sums[i] / n, self.tops[i])
            for i, n in enumerate(self.tokens)
            if n
        )


class RolloutsTally:
    def __init__(self, correction: Correction = DEFAULTS) -> None:
        self.correction = correction
        self.importance = ImportanceTally(correction)
        self.masked_tokens = 0  # scored, not counted (the lines' masks)
        self._by_step: dict[int, ImportanceTally] = {}
        self._by_group: dict[str, ImportanceTally] = {}
        self.deltas = DeltaSpill()
        self.by_position, self.by_entropy = _Bands(POSITION_EDGES), _Bands(ENTROPY_EDGES)
        # min-heaps of the WORST largest: (key, -line, -step, what); ties go to the earlier line and step
        self._sequences: list[tuple] = []
        self._tokens: list[tuple] = []
        self._low, self._high = math.inf, -math.inf  # the least and greatest δ

    def add(self, record: Record) -> None:
        seq = record.counted  # the tokens a mask leaves out are scored, not counted
        self.masked_tokens += len(record.logprobs.trainer) - len(seq.trainer)
        self.importance.add(seq)
        for key, tallies in ((record.step, self._by_step), (record.group, self._by_group)):
            if key is not None:
                self._tally_of(tallies, key).add(seq)
        deltas = seq.deltas
        self.deltas.add(deltas)
        if deltas:
            self._low, self._high = min(self._low, *deltas), max(self._high, *deltas)
        _keep(self._sequences, (abs(seq.log_ratio), -record.line, 0, record))
        mask = record.mask
        for step, (delta, entropy) in enumerate(zip(record.logprobs.deltas, record.entropy)):
            if mask is not None and not mask[step]:
                continue
            self.by_position.add(step, abs(delta))
            self.by_entropy.add(entropy, abs(delta))
            if len(self._tokens) < WORST or abs(delta) > self._tokens[0][0]:
                _keep(self._tokens, (abs(delta), -record.line, -step, record))

    def _tally_of(self, tallies: dict, key) -> ImportanceTally:
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = ImportanceTally(self.correction)
        return tally

    def close(self) -> None:
        self.deltas.close()

    def summary(self, decode: Callable[[list[int]], str], label: Callable[[int], str], **rest) -> RolloutsSummary:
        """The summary; `decode(ids)` gives a completion's text, `label(id)` a token's as the views show it; `rest`:
        the summary's other fields."""
        metrics = self.importance.metrics()
        delta_hist = Histogram(*map(tuple, self.deltas.histogram(self._low, self._high, lambda d: d)))
        ratio_hist = Histogram(*map(tuple, self.deltas.histogram(metrics.ratio_min, metrics.ratio_max, torch.exp)))

        def token(record: Record, step: int) -> ScoredToken:
            seq, token_id = record.logprobs, record.completion_ids[step]
            top1 = None if seq.top1_disagree is None else seq.top1_disagree[step]
            sampler_top1 = None if record.top1_ids is None else label(record.top1_ids[step])
            return ScoredToken(step, token_id, label(token_id), seq.trainer[step], seq.sampler[step], top1,
                               sampler_top1)  # fmt: skip

        def scored(record: Record) -> tuple[ScoredToken, ...]:
            return tuple(token(record, step) for step in range(len(record.completion_ids)))

        sequences = tuple(
            WorstSequence(
                record.line,
                record.counted.log_ratio,
                max(map(abs, record.counted.deltas), default=0.0),
                decode(list(record.completion_ids)),
                scored(record),
            )
            for *_, record in sorted(self._sequences, reverse=True)
        )
        tokens = tuple(
            WorstToken(record.line, token(record, -minus_step))
            for _, _, minus_step, record in sorted(self._tokens, reverse=True)
        )
        return RolloutsSummary(
            metrics=metrics,
            abs_diff_percentiles=self.deltas.abs_percentiles(),
            delta_histogram=delta_hist,
            ratio_histogram=ratio_hist,
            worst_sequences=sequences,
            worst_tokens=tokens,
            by_position=self.by_position.bands(),
            by_entropy=self.by_entropy.bands(),
            masked_tokens=self.masked_tokens,
            by_step=tuple((key, tally.metrics()) for key, tally in sorted(self._by_step.items())),
            by_group=tuple((key, tally.metrics()) for key, tally in sorted(self._by_group.items())),
            **rest,
        )


def _keep(heap: list, item: tuple) -> None:
    """`item` among the WORST largest of `heap`."""
    if len(heap) < WORST:
        heapq.heappush(heap, item)
    elif item[:3] > heap[0][:3]:
        heapq.heapreplace(heap, item)
