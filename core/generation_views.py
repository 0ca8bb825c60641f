"""What the app's generation view draws, from a `GenerationComparison`: torch-free, tested directly."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .generation_result import TextGeneration


@dataclass(frozen=True)
class ContinuationToken:
    token: str
    state: str  # "shared" (both runs chose it), "split" (the first token the runs chose differently), "after"


def continuation_tokens(text: TextGeneration, run: str) -> list[ContinuationToken]:
    """The `run` ("single" or "batched") continuation token by token, marked against the other run."""
    ids = getattr(text, run).token_ids
    names = text.steps.token_texts
    split = len(ids) if text.split_step is None else text.split_step
    return [
        ContinuationToken(names[i], "shared" if step < split else "split" if step == split else "after")
        for step, i in enumerate(ids)
    ]


@dataclass(frozen=True)
class StepCurve:
    """Per compared step (up to the split): log10 of the next-token max|Δ| and of the single run's top-1
    margin (None where zero). Where the margin falls to the Δ, rounding can change the chosen token."""

    steps: tuple[int, ...]
    log10_max_abs_diff: tuple[float | None, ...]
    log10_margin: tuple[float | None, ...]


def step_curve(text: TextGeneration) -> StepCurve:
    columns = text.steps
    return StepCurve(
        steps=tuple(range(len(columns.max_abs_diff))),
        log10_max_abs_diff=tuple(_log10(v) for v in columns.max_abs_diff),
        log10_margin=tuple(_log10(v) for v in columns.margin),
    )


def _log10(value: float) -> float | None:
    return math.log10(value) if value > 0 and math.isfinite(value) else None


def describe_split(text: TextGeneration) -> str:
    """`split at step 3 (near-tie)`, `same for 32 tokens`."""
    if text.split_step is None:
        return f"same for {len(text.single.token_ids)} tokens"
    return f"split at step {text.split_step}" + (" (near-tie)" if text.near_tie else "")
