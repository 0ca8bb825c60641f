"""The result of scoring a rollouts file (`batchtui rollouts`): plain dataclasses the CLI, the app and JSON render.

The metrics are `numbers.importance`'s over every scored token; `abs_diff_percentiles` the nearest-rank percentiles
of |δ| (the ⌈p·n⌉-th smallest); the histograms count δ and the ratio exp(δ) in equal bins between their least and
greatest value; the worst sequences are those with the largest |Σ δ| (the log of the sequence's importance ratio,
what `chi2_seq` weighs), the worst tokens those with the largest |δ|; `by_position` and `by_entropy` give |δ| over
the tokens in bands of their place in the completion and of the trainer's entropy at them (the sampler's distribution
is not in the lines; where the two agree, the trainer's is the sampler's).
"""

from __future__ import annotations

from dataclasses import dataclass

from .importance import ImportanceMetrics, importance_ratio
from .trl_parts import TrlParts


@dataclass(frozen=True)
class Histogram:
    edges: tuple[float, ...]  # bins + 1 edges; empty without tokens
    counts: tuple[int, ...]


@dataclass(frozen=True)
class ScoredToken:
    step: int  # in the completion, from 0
    token_id: int
    token: str
    trainer: float  # lt
    sampler: float  # lr
    top1_disagree: bool | None = None  # the trainer's top-1 is not the sampler's (None: the line gives no top-1)
    sampler_top1: str | None = None  # the sampler's top-1 as the views show a token (None: the line gives none)

    @property
    def delta(self) -> float:
        return self.trainer - self.sampler

    @property
    def ratio(self) -> float:
        return importance_ratio(self.delta)


@dataclass(frozen=True)
class WorstSequence:
    line: int  # in the rollouts file
    log_ratio: float  # Σ δ over its tokens
    max_abs_diff: float
    completion: str  # its text, as the tokenizer decodes it
    tokens: tuple[ScoredToken, ...]

    @property
    def worst_step(self) -> int:
        """The first of its counted tokens with the largest |δ| (the first token where it has none)."""
        return next((i for i, t in enumerate(self.tokens) if abs(t.delta) == self.max_abs_diff), 0)


@dataclass(frozen=True)
class WorstToken:
    line: int
    token: ScoredToken


@dataclass(frozen=True)
class DeltaBand:
    """|δ| over the tokens whose place in the completion (from 0), or entropy, lies in [low, high)."""

    low: float
    high: float  # inf for the last band
    tokens: int
    mean_abs_diff: float
    max_abs_diff: float


@dataclass(frozen=True)
class BatchNoise:
    """The trainer's own batch noise, measured on a run in the mode (`rollouts.batch_noise`): the first batch's
    sequences scored in their batch and each alone, without the mode and with it."""

    lines: tuple[int, ...]  # the sequences (their lines in the rollouts file)
    tokens: int
    moved: int  # tokens whose logprob, without the mode, is not the same bits in the batch and alone
    max_abs_diff: float  # the largest such move
    moved_in_mode: int  # the same in the mode (0: it holds)


@dataclass(frozen=True)
class RolloutsSummary:
    config: dict
    metrics: ImportanceMetrics
    abs_diff_percentiles: dict[str, float]  # "p50", "p90", "p99", "p99.9"
    delta_histogram: Histogram
    ratio_histogram: Histogram
    worst_sequences: tuple[WorstSequence, ...]
    worst_tokens: tuple[WorstToken, ...]
    skipped: int  # faulty lines skipped (`--skip-bad`)
    faults: tuple[str, ...]  # the first of them, in words
    resumed: int  # sequences read back from the records file, not scored again
    elapsed_s: float
    by_position: tuple[DeltaBand, ...] = ()  # the bands with tokens, in order
    by_entropy: tuple[DeltaBand, ...] = ()
    max_kl: float | None = None  # `--max-kl`: the kl a run may have at most
    batch_noise: BatchNoise | None = None  # with `--invariant` (rank 0's first batch): what the mode removed
    trl_parts: TrlParts | None = None  # with `--trainer trl` (rank 0's first batch): which of TRL's ways moves them
    masked_tokens: int = 0  # scored but not counted: the lines' masks left them out
    by_step: tuple[tuple[int, ImportanceMetrics], ...] = ()  # the metrics of each `step` the lines name, in order
    by_group: tuple[tuple[str, ImportanceMetrics], ...] = ()  # ... of each `group`, in the order of their names

    @property
    def kl_within(self) -> bool | None:
        """Whether the kl is at most `max_kl` (None without one; False without a kl: nothing scored)."""
        if self.max_kl is None:
            return None
        kl = self.metrics.kl
        return kl is not None and kl <= self.max_kl

    @property
    def bitwise(self) -> bool:
        return self.metrics.tokens > 0 and self.metrics.bitwise
