"""Sampler vs trainer: the logprobs two runs gave the same tokens, in the numbers RL trainers log.

lr is the sampler's logprob of a token it chose (decoding over a KV cache, in a batch, or a server's), lt the
trainer's (one forward of prompt + completion, training mode, log_softmax in float32 at the chosen token);
δ = lt − lr and ratio = exp(δ), the importance ratio (1 where trainer and sampler agree). Over tokens unless said
(the names verl's rollout correction logs): `kl` = mean(lr − lt), `k3_kl` = mean(ratio − 1 − δ), `chi2_token` =
mean(ratio²) − 1, `chi2_seq` = mean over sequences of exp(2 Σ δ) − 1, `training_ppl` / `rollout_ppl` = mean over
sequences of exp(−mean lt) / exp(−mean lr), `log_ppl_diff` = mean over sequences of (mean lr − mean lt), `ppl_ratio`
= mean over sequences of exp(mean lr − mean lt) (a sequence's training perplexity over its rollout perplexity);
against the trainer's correction settings (`Correction`: PPO's ε, truncated importance sampling's cap and floor):
`clip_fraction` = share of tokens with |ratio − 1| > ε, `tis_fraction` = share with ratio > cap, `tis_low_fraction`
= share with ratio < floor, `masked_token_fraction` = share of tokens and `masked_seq_fraction` share of sequences
whose ratio (a sequence's: exp(Σ δ)) is outside [floor, cap] (what token- and sequence-level rejection masks);
`seq_ratio_min` / `_mean` / `_max` of the sequences' ratios; `ess_token` = (Σ ratio)² / (n Σ ratio²) over tokens
and `ess_seq` the same over sequences (the effective sample size as a fraction: 1 where every ratio is equal, 1/n
where one outweighs the rest; computed from the logs, so that no ratio overflows). Computed in float64 from the
float32 logprobs: where the two runs agree bit for bit, every ratio is exactly 1 and every metric exactly 0 (the
fractions) or 1 (the ratios, the effective sample sizes).

`ImportanceTally` takes sequences one at a time (a dataset's thousands streamed), holding only sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import cached_property

_LARGEST_EXPONENT = math.log(1.7976931348623157e308)  # exp of more overflows a float


@dataclass(frozen=True)
class Correction:
    """The trainer's rollout-correction settings the fractions count against."""

    clip_eps: float = 0.2  # PPO's clip range: a ratio outside [1 − ε, 1 + ε] is clipped
    tis_cap: float = 2.0  # truncated importance sampling's usual cap: a ratio above it is truncated
    tis_floor: float | None = None  # a lower cap, where the trainer sets one

    @property
    def floor(self) -> float:
        return 0.0 if self.tis_floor is None else self.tis_floor

    def outside(self, ratio: float) -> bool:
        """Whether a rejection-sampling trainer masks a ratio: outside [floor, cap]."""
        return ratio > self.tis_cap or ratio < self.floor


DEFAULTS = Correction()


class _LogSum:
    """log Σ exp(x) over the values added, streamed (the largest kept apart, so that no term overflows); `inf` counts
    the infinite values, which outweigh every finite one."""

    def __init__(self) -> None:
        self.top, self.scaled, self.infinite = -math.inf, 0.0, 0

    def add(self, x: float) -> None:
        if x == math.inf:
            self.infinite += 1
        elif x > self.top:
            self.scaled = self.scaled * math.exp(self.top - x) + 1.0
            self.top = x
        else:
            self.scaled += math.exp(x - self.top)

    def value(self) -> float:
        return self.top + math.log(self.scaled) if self.scaled else -math.inf


def effective_size(logs: _LogSum, squares: _LogSum, n: int) -> float | None:
    """(Σ r)² / (n Σ r²) from log Σ r and log Σ r² (r = exp(x)); with infinite ratios, their count over n."""
    if not n:
        return None
    if logs.infinite:
        return logs.infinite / n
    return math.exp(2 * logs.value() - math.log(n) - squares.value())


def logprob_move(before: float, after: float) -> float:
    """after − before: 0 for the same value (two NaNs or two −infs alike), infinite where they differ and one is
    not a finite number, so that no max() hides a NaN and −inf − −inf is no NaN."""
    if before == after or (math.isnan(before) and math.isnan(after)):
        return 0.0
    if not (math.isfinite(before) and math.isfinite(after)):
        return math.inf
    return after - before


def importance_ratio(delta: float) -> float:
    """exp(δ), infinite past the largest float (a served logprob of -800 against a local -0.1) instead of an error."""
    return math.inf if delta > _LARGEST_EXPONENT else math.exp(delta)


@dataclass(frozen=True)
class SequenceLogprobs:
    """One sequence's completion tokens: the trainer's and the sampler's logprob of each, and where the sampler's
    top-1 is known, whether the trainer's top-1 is another token."""

    trainer: tuple[float, ...]
    sampler: tuple[float, ...]
    top1_disagree: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.trainer) != len(self.sampler) or (
            self.top1_disagree is not None and len(self.top1_disagree) != len(self.trainer)
        ):
            raise ValueError("a sequence's trainer and sampler logprobs must cover the same tokens")

    @cached_property
    def deltas(self) -> tuple[float, ...]:
        """δ = lt − lr of each token."""
        return tuple(t - s for t, s in zip(self.trainer, self.sampler))

    @cached_property
    def log_ratio(self) -> float:
        """Σ δ, exactly rounded: the log of the sequence's importance ratio (±inf past the largest float: logprobs
        of -1e308 sum past it)."""
        try:
            return math.fsum(self.deltas)
        except OverflowError:
            return sum(self.deltas)  # (a partial sum past the largest float: inf, or nan where both ways)

    @cached_property
    def metrics(self) -> ImportanceMetrics:
        """The metrics over this sequence's tokens."""
        return importance_metrics([self])

    @property
    def first_differing_step(self) -> int | None:
        """The first completion token whose two logprobs are not the same bits; None where none."""
        return next((i for i, (t, s) in enumerate(zip(self.trainer, self.sampler)) if t != s), None)


@dataclass(frozen=True)
class ImportanceMetrics:
    """The metrics of a set of sequences (see the module's doc); None where there is no token to measure."""

    sequences: int
    tokens: int
    max_abs_diff: float | None
    mean_abs_diff: float | None
    ratio_min: float | None
    ratio_max: float | None
    kl: float | None
    k3_kl: float | None
    chi2_token: float | None
    chi2_seq: float | None
    training_ppl: float | None
    rollout_ppl: float | None
    log_ppl_diff: float | None
    clip_fraction: float | None
    tis_fraction: float | None
    top1_disagree: int | None  # tokens whose trainer top-1 is not the sampler's, where the sampler's is known
    tis_low_fraction: float | None = None  # None without a floor
    masked_token_fraction: float | None = None
    masked_seq_fraction: float | None = None
    seq_ratio_min: float | None = None
    seq_ratio_mean: float | None = None
    seq_ratio_max: float | None = None
    ess_token: float | None = None
    ess_seq: float | None = None
    ppl_ratio: float | None = None

    @property
    def bitwise(self) -> bool:
        """Every token's two logprobs the same bits (every ratio exactly 1)."""
        return self.max_abs_diff == 0.0 and not self.top1_disagree

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ImportanceTally:
    """Sums over the sequences added so far; `metrics()` at any point."""

    def __init__(self, correction: Correction = DEFAULTS) -> None:
        self.correction = correction
        self.sequences = self.tokens = self.measured_sequences = 0
        self.abs_sum = self.kl_sum = self.k3_sum = self.ratio_sq_sum = 0.0
        self.chi2_seq_sum = self.training_ppl_sum = self.rollout_ppl_sum = self.log_ppl_sum = 0.0
        self.ppl_ratio_sum = self.seq_ratio_sum = 0.0
        self.clipped = self.capped = self.below = self.masked = self.masked_seqs = 0
        self.max_abs: float | None = None
        self.ratio_min: float | None = None
        self.ratio_max: float | None = None
        self.seq_ratio_min: float | None = None
        self.seq_ratio_max: float | None = None
        self.top1: int | None = None
        # log Σ ratio and log Σ ratio² over the tokens and over the sequences (the effective sample sizes)
        self.token_logs, self.token_squares = _LogSum(), _LogSum()
        self.seq_logs, self.seq_squares = _LogSum(), _LogSum()

    def add(self, seq: SequenceLogprobs) -> None:
        self.sequences += 1
        n = len(seq.trainer)
        if n == 0:
            return
        self.measured_sequences += 1
        self.tokens += n
        deltas = seq.deltas
        ratios = [importance_ratio(d) for d in deltas]
        self.abs_sum += sum(abs(d) for d in deltas)
        self.kl_sum += sum(-d for d in deltas)
        self.k3_sum += sum(r - 1 - d for r, d in zip(ratios, deltas))
        self.ratio_sq_sum += sum(r * r for r in ratios)
        self.chi2_seq_sum += math.exp(min(2 * sum(deltas), 700.0)) - 1
        mean_t, mean_s = sum(seq.trainer) / n, sum(seq.sampler) / n
        self.training_ppl_sum += math.exp(min(-mean_t, 700.0))
        self.rollout_ppl_sum += math.exp(min(-mean_s, 700.0))
        self.log_ppl_sum += mean_s - mean_t
        self.ppl_ratio_sum += math.exp(min(mean_s - mean_t, 700.0))
        correction = self.correction
        self.clipped += sum(abs(r - 1) > correction.clip_eps for r in ratios)
        self.capped += sum(r > correction.tis_cap for r in ratios)
        self.below += sum(r < correction.floor for r in ratios)
        self.masked += sum(correction.outside(r) for r in ratios)
        for d in deltas:
            self.token_logs.add(d)
            self.token_squares.add(2 * d)
        log_ratio = math.inf if math.isnan(seq.log_ratio) else seq.log_ratio  # (NaN: past the floats both ways)
        seq_ratio = importance_ratio(log_ratio)
        self.seq_ratio_sum += seq_ratio
        self.masked_seqs += correction.outside(seq_ratio)
        self.seq_ratio_min = seq_ratio if self.seq_ratio_min is None else min(self.seq_ratio_min, seq_ratio)
        self.seq_ratio_max = seq_ratio if self.seq_ratio_max is None else max(self.seq_ratio_max, seq_ratio)
        self.seq_logs.add(log_ratio)
        self.seq_squares.add(2 * log_ratio)
        top = max(abs(d) for d in deltas)
        self.max_abs = top if self.max_abs is None else max(self.max_abs, top)
        self.ratio_min = min(ratios) if self.ratio_min is None else min(self.ratio_min, *ratios)
        self.ratio_max = max(ratios) if self.ratio_max is None else max(self.ratio_max, *ratios)
        if seq.top1_disagree is not None:
            self.top1 = (self.top1 or 0) + sum(seq.top1_disagree)

    def metrics(self) -> ImportanceMetrics:
        tokens, seqs = self.tokens, self.measured_sequences
        per_token = (lambda total: total / tokens) if tokens else (lambda total: None)
        per_seq = (lambda total: total / seqs) if seqs else (lambda total: None)
        return ImportanceMetrics(
            sequences=self.sequences,
            tokens=tokens,
            max_abs_diff=self.max_abs,
            mean_abs_diff=per_token(self.abs_sum),
            ratio_min=self.ratio_min,
            ratio_max=self.ratio_max,
            kl=per_token(self.kl_sum),
            k3_kl=per_token(self.k3_sum),
            chi2_token=None if not tokens else self.ratio_sq_sum / tokens - 1,
            chi2_seq=per_seq(self.chi2_seq_sum),
            training_ppl=per_seq(self.training_ppl_sum),
            rollout_ppl=per_seq(self.rollout_ppl_sum),
            log_ppl_diff=per_seq(self.log_ppl_sum),
            clip_fraction=per_token(self.clipped),
            tis_fraction=per_token(self.capped),
            top1_disagree=self.top1,
            tis_low_fraction=None if self.correction.tis_floor is None else per_token(self.below),
            masked_token_fraction=per_token(self.masked),
            masked_seq_fraction=per_seq(self.masked_seqs),
            seq_ratio_min=self.seq_ratio_min,
            seq_ratio_mean=per_seq(self.seq_ratio_sum),
            seq_ratio_max=self.seq_ratio_max,
            ess_token=effective_size(self.token_logs, self.token_squares, tokens),
            ess_seq=effective_size(self.seq_logs, self.seq_squares, seqs),
            ppl_ratio=per_seq(self.ppl_ratio_sum),
        )


def importance_metrics(sequences: Iterable[SequenceLogprobs], correction: Correction = DEFAULTS) -> ImportanceMetrics:
    tally = ImportanceTally(correction)
    for seq in sequences:
        tally.add(seq)
    return tally.metrics()
