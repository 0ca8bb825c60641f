"""What `measure_endpoint()` measured: each text's continuations alone (twice) and under load, and where they part.

Steps are tokens where the server reports its tokens (with logprobs), else characters of the continuation's
text. Logprob differences are compared like `generate`'s logits: up to the split both runs read the same
prefix; at the split the alone run's token is looked up in the other run's top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from ..numbers.comparison import RunResult
from ..numbers.importance import logprob_move
from ..run.backend import ServedContinuation
from .server_batch import ServerBatch

if TYPE_CHECKING:
    from .vs_local import ServedVsLocal

DEFAULT_LADDER = (1, 2, 4, 8, 16, 32)  # `endpoint`'s concurrency levels unless given


@dataclass(frozen=True)
class ContinuationSplit:
    """Where a continuation departs from the alone run (`reference`)."""

    step: int | None  # the first step where they differ; None: the same continuation
    # Per step up to the split (inclusive): the other run's logprob of the alone run's token minus the alone
    # run's (None where the other run's top-k lacks it). Empty without logprobs.
    logprob_diffs: tuple[float | None, ...]
    reference_top: tuple[tuple[str, float], ...]  # at the split: the alone run's top-k
    other_top: tuple[tuple[str, float], ...]
    margin: float | None  # at the split: the alone run's top-1 minus top-2 logprob

    @property
    def differs(self) -> bool:
        return self.step is not None

    @property
    def logprobs_differ(self) -> bool:
        """The same tokens, but some step's logprob is not bitwise the alone run's."""
        return self.step is None and any(d is not None and d != 0.0 for d in self.logprob_diffs)

    @property
    def bitwise(self) -> bool:
        return not self.differs and not self.logprobs_differ

    @property
    def max_abs_diff(self) -> float:
        """The largest |Δ logprob| over the steps both runs chose alike (before the split, or all of them): the
        split step's own Δ holds the swap it made, not a move of a token both chose."""
        shared = self.logprob_diffs if self.step is None else self.logprob_diffs[: self.step]
        return max((abs(d) for d in shared if d is not None), default=0.0)

    @property
    def others_moved(self) -> float:
        """At the split: the largest |Δ logprob| of a token both runs' top-k list there, but for the two top-1s
        (whose moves are the swap itself); 0 without a split or such a token."""
        if not self.reference_top or not self.other_top:
            return 0.0
        swapped = {self.reference_top[0][0], self.other_top[0][0]}
        theirs = dict(self.other_top)
        return max(
            (abs(logprob_move(lp, theirs[t])) for t, lp in self.reference_top if t in theirs and t not in swapped),
            default=0.0,
        )

    @property
    def near_tie(self) -> bool | None:
        """At the split, the alone run's top-1 margin was within twice what the logprobs moved otherwise (on the
        steps before it, and at it on the tokens not swapped), as `check` sets a margin against max|Δ|: moves of
        that size could change the choice. None without a split or without logprobs."""
        if self.step is None or self.margin is None:
            return None
        return self.margin <= 2 * max(self.max_abs_diff, self.others_moved)


def split_of(reference: ServedContinuation, other: ServedContinuation) -> ContinuationSplit:
    if reference.steps is None or other.steps is None:
        step = _first_difference(reference.text, other.text)
        return ContinuationSplit(step, (), (), (), None)
    ours = [s.token for s in reference.steps]
    theirs = [s.token for s in other.steps]
    step = _first_difference(ours, theirs)
    last = len(ours) - 1 if step is None else min(step, len(ours) - 1)
    paired = [other.steps[i] if i < len(theirs) else None for i in range(last + 1)]
    diffs = tuple(_logprob_diff(ours_step, theirs_step) for ours_step, theirs_step in zip(reference.steps, paired))
    if step is None or step >= len(ours):
        return ContinuationSplit(step, diffs, (), (), None)
    top = reference.steps[step].top
    margin = top[0][1] - top[1][1] if len(top) >= 2 else None
    other_top = other.steps[step].top if step < len(theirs) else ()
    return ContinuationSplit(step, diffs, top, other_top, margin)


def _first_difference(a, b) -> int | None:
    step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if step is None and len(a) != len(b):
        step = min(len(a), len(b))
    return step


def _logprob_diff(ours, theirs) -> float | None:
    if theirs is None or ours.logprob is None:
        return None
    if theirs.token == ours.token and theirs.logprob is not None:
        return logprob_move(ours.logprob, theirs.logprob)
    found = dict(theirs.top).get(ours.token)
    return None if found is None else logprob_move(ours.logprob, found)


@dataclass(frozen=True)
class PromptComparison:
    """The prompt's positions compared between two runs from their prompt logprobs: per position the largest
    |Δ logprob| over the tokens both list, and whether their most likely token differs."""

    max_abs_diff: tuple[float, ...]  # NaN where a position has no logprobs (the first)
    top1_flip: tuple[bool, ...]

    @property
    def max(self) -> float:
        return max((d for d in self.max_abs_diff if not math.isnan(d)), default=0.0)


def prompt_comparison(reference: ServedContinuation, other: ServedContinuation) -> PromptComparison | None:
    if reference.prompt is None or other.prompt is None:
        return None
    diffs, flips = [], []
    for ours, theirs in zip(reference.prompt, other.prompt):
        if not ours or not theirs:
            diffs.append(math.nan)
            flips.append(False)
            continue
        both = dict(theirs)
        shared = [abs(logprob_move(lp, both[t])) for t, lp in ours if t in both]
        diffs.append(max(shared, default=math.nan))
        flips.append(ours[0][0] != theirs[0][0])
    return PromptComparison(tuple(diffs), tuple(flips))


@dataclass(frozen=True)
class PrefillDecode:
    """Per continuation token: its logprob in one prefill of prompt + continuation minus its decoded logprob."""

    diffs: tuple[float, ...]

    @property
    def steps(self) -> int:
        return len(self.diffs)

    @property
    def max_abs_diff(self) -> float:
        return max((abs(d) for d in self.diffs), default=0.0)

    @property
    def first_differing_step(self) -> int | None:
        return next((step for step, d in enumerate(self.diffs) if d != 0.0), None)


@dataclass(frozen=True)
class PrefixCacheCheck:
    cached_tokens: int | None  # of the second request's prompt, where the server says; None: unknown
    split: ContinuationSplit  # the second request's continuation against the first's

    @property
    def differs(self) -> bool:
        return not self.split.bitwise

    @property
    def max_abs_diff(self) -> float:
        return self.split.max_abs_diff


@dataclass(frozen=True)
class ServedText:
    """One text's continuations: alone (nothing else in flight), alone again, and under load at each level of
    the concurrency ladder (every round's, in order). A run that failed part-way leaves the missing ones None or
    out."""

    index: int
    line: int
    text: str
    alone: ServedContinuation | None
    alone_again: ServedContinuation | None
    levels: tuple[tuple[ServedContinuation, ...], ...]
    prefill_decode: PrefillDecode | None = None  # None: not measured (the notes say why)
    prefix_cache: PrefixCacheCheck | None = None
    served_vs_local: ServedVsLocal | None = None  # with a local model (`--local`)
    alone_more: tuple[ServedContinuation, ...] = ()  # alone again after `alone_again`: a level's rounds in all

    @cached_property
    def under_load(self) -> tuple[ServedContinuation, ...]:
        """Every continuation under load, level after level."""
        return tuple(answer for level in self.levels for answer in level)

    def level_splits(self, level: int) -> tuple[ContinuationSplit, ...]:
        """Alone against each continuation at ladder level `level`."""
        if self.alone is None or level >= len(self.levels):
            return ()
        return tuple(split_of(self.alone, answer) for answer in self.levels[level])

    @cached_property
    def noise(self) -> ContinuationSplit | None:
        """Alone against alone again: what differs with nothing else in flight."""
        if self.alone is None or self.alone_again is None:
            return None
        return split_of(self.alone, self.alone_again)

    @cached_property
    def noisy(self) -> bool:
        """Identical requests with nothing else in flight gave this text other answers (tokens or logprobs): the
        server's own noise, not load's or the cache's."""
        if self.alone is None:
            return False
        again = [a for a in (self.alone_again, *self.alone_more) if a is not None]
        return any(not split_of(self.alone, a).bitwise for a in again)

    @cached_property
    def rounds(self) -> tuple[ContinuationSplit, ...]:
        """Alone against each round under load."""
        return () if self.alone is None else tuple(split_of(self.alone, u) for u in self.under_load)

    @property
    def shown_round(self) -> int | None:
        """The round reported: the first whose continuation differs, else the first."""
        if not self.rounds:
            return None
        return next((r for r, s in enumerate(self.rounds) if s.differs), 0)

    @property
    def split(self) -> ContinuationSplit | None:
        return None if self.shown_round is None else self.rounds[self.shown_round]

    @property
    def measured(self) -> bool:
        return bool(self.rounds) and self.noise is not None

    @property
    def differs(self) -> bool | None:
        """Under load, some round's continuation departs from the alone run (None: not measured)."""
        return None if not self.rounds else any(s.differs for s in self.rounds)

    @property
    def logprobs_differ(self) -> bool:
        """Under load every continuation keeps the alone run's tokens, but some logprob is not bitwise its."""
        return not self.differs and any(s.logprobs_differ for s in self.rounds)

    @property
    def split_step(self) -> int | None:
        split = self.split
        return None if split is None else split.step

    @property
    def near_tie(self) -> bool | None:
        split = self.split
        return None if split is None else split.near_tie

    @property
    def max_abs_diff(self) -> float:
        return max((s.max_abs_diff for s in self.rounds), default=0.0)

    @cached_property
    def prompt(self) -> PromptComparison | None:
        if self.alone is None or self.shown_round is None:
            return None
        return prompt_comparison(self.alone, self.under_load[self.shown_round])


@dataclass(frozen=True)
class EndpointSummary:
    texts: int
    measured: int  # texts with every run done
    differ: int  # continuations that differ under load (their tokens, or their text)
    logprobs_differ: int  # continuations that keep their tokens under load, with logprobs not bitwise the same
    alone_differ: int  # texts whose answers alone, asked again, are not bitwise the same (tokens or logprobs)
    near_ties: int
    max_abs_diff: float


@dataclass(frozen=True)
class LadderLevel:
    """One level of the concurrency ladder: what `concurrency` requests in flight did to the texts."""

    concurrency: int
    rounds: int
    # Of the texts whose answers alone do not move (the others' moves are the server's own noise, not load's):
    texts_split: int  # texts some continuation of which parts from the alone run's tokens
    texts_logprobs_differ: int  # texts that keep their tokens, with some logprob not bitwise the alone run's
    max_abs_logprob_diff: float  # over the steps both runs share
    texts_noisy: int = 0  # texts left out: their answers alone move by themselves
    server: ServerBatch | None = None  # the server's own batch meanwhile, where its metrics say

    @property
    def breaks(self) -> bool:
        return bool(self.texts_split or self.texts_logprobs_differ)


@dataclass(frozen=True)
class EndpointComparison(RunResult):
    """Every text's served continuations, the settings and capabilities found, and the fault that stopped the
    run (None when it ran to the end)."""

    texts: tuple[ServedText, ...]
    failure: str | None = None
    # Per level of the ladder, the server's own batch as its metrics said (None where it says nothing)
    server_batches: tuple[ServerBatch | None, ...] = ()

    @property
    def summary(self) -> EndpointSummary:
        return EndpointSummary(
            texts=len(self.texts),
            measured=sum(t.measured for t in self.texts),
            differ=sum(bool(t.differs) for t in self.texts),
            logprobs_differ=sum(t.logprobs_differ for t in self.texts),
            alone_differ=sum(t.noisy for t in self.texts),
            near_ties=sum(bool(t.near_tie) for t in self.texts),
            max_abs_diff=self.max_abs_diff,
        )

    @property
    def any_differs(self) -> bool:
        s = self.summary
        return bool(s.differ or s.logprobs_differ or s.alone_differ)

    @cached_property
    def ladder(self) -> tuple[LadderLevel, ...]:
        """Each level of the concurrency ladder, lowest first."""
        levels = []
        for number, concurrency in enumerate(self.config.get("concurrency") or ()):
            splits = [(t.noisy, t.level_splits(number)) for t in self.texts]
            measured = [s for noisy, s in splits if s and not noisy]
            levels.append(
                LadderLevel(
                    concurrency=concurrency,
                    rounds=self.config.get("rounds", 1),
                    texts_split=sum(any(s.differs for s in text) for text in measured),
                    texts_logprobs_differ=sum(
                        not any(s.differs for s in text) and any(s.logprobs_differ for s in text) for text in measured
                    ),
                    max_abs_logprob_diff=max((s.max_abs_diff for text in measured for s in text), default=0.0),
                    texts_noisy=sum(noisy and bool(s) for noisy, s in splits),
                    server=self.server_batches[number] if number < len(self.server_batches) else None,
                )
            )
        return tuple(levels)

    @property
    def first_breaking_concurrency(self) -> int | None:
        """The lowest level at which some text whose answers alone do not move parts or its logprobs move; None when
        none does."""
        return next((level.concurrency for level in self.ladder if level.breaks), None)


def batch_ceiling(ladder: tuple[LadderLevel, ...]) -> LadderLevel | None:
    """The first level at which the server ran no more requests at once than at the level below (the rest waited):
    its batch is full there; None where every level ran more, or the metrics do not say."""
    for below, level in zip(ladder, ladder[1:]):
        if below.server is not None and level.server is not None and level.server.running <= below.server.running:
            return level
    return None
