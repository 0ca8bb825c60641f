"""What the app's generation view draws, from a `GenerationComparison`: torch-free, tested directly."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.numbers.comparison import TopToken
from ...core.numbers.generation_result import GenerationComparison, TextGeneration
from ...core.terminal.plain import format_float, format_precise


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


def local_checks(text: TextGeneration) -> str:
    """The text's other checks in words: its decode steps against a prefill, and the sampler's logprobs (the
    batched decode's) against the trainer's forward; empty where neither was measured."""
    words = []
    if text.vs_prefill is not None:
        step = text.vs_prefill.first_differing_step
        where = f" in {text.vs_prefill.first_module}" if text.vs_prefill.first_module else ""
        words.append("decode vs prefill: " + ("bitwise" if step is None else f"first differs at step {step}{where}"))
    if text.vs_trainer is not None:
        m = text.vs_trainer.metrics
        words.append(
            "trainer vs sampler: "
            + ("bitwise (every ratio 1)" if m.bitwise else
               f"max|δ| {format_float(m.max_abs_diff)}, kl {format_float(m.kl)}, ratio "
               f"{format_precise(m.ratio_min)}-{format_precise(m.ratio_max)}, first at step "
               f"{text.vs_trainer.first_differing_step}"
               + (f" in {text.vs_trainer_module}" if text.vs_trainer_module else "")
               + (f", at {text.vs_trainer_op.words()}: {text.vs_trainer_op.cause()}" if text.vs_trainer_op else ""))
        )  # fmt: skip
    return "; ".join(words)


@dataclass(frozen=True)
class RunText:
    """One run's continuation as the view shows it: a title, then its pieces marked against the other run."""

    title: str
    pieces: tuple[ContinuationToken, ...]


@dataclass(frozen=True)
class TextRow:
    """One text in the generation view: its table row, its two continuations, its curve and the split's top-k."""

    line: int
    split_cell: str  # "same", "3", "3 tie"
    words: tuple[str, str]  # at the split: the first run's choice, then the second's
    runs: tuple[RunText, RunText]
    curve: StepCurve | None  # None where nothing per step was measured (a server without logprobs)
    upto: str  # which steps the curve covers
    about: str  # `split at step 3 (near-tie)`, shown where there is no split top-k
    split_top: tuple[tuple[TopToken, ...], tuple[TopToken, ...]] | None
    checks: str = ""  # a served text's other checks in words: prefill vs decode, prefix cache, served vs local


@dataclass(frozen=True)
class LadderView:
    """A served run's concurrency ladder as the app charts it: per level, the texts that split and those that keep
    their tokens with logprobs moved."""

    concurrency: tuple[int, ...]
    split: tuple[int, ...]
    logprobs_differ: tuple[int, ...]
    caption: str


@dataclass(frozen=True)
class GenerationScreen:
    """What the generation view draws for one result: local (batched vs alone) or served (load vs alone)."""

    verdict: str
    headers: tuple[str, str]  # the two runs, as the table and the top-k name them
    curve_labels: tuple[str, str]
    value_name: str  # what the top-k's numbers are: "logit" or "logprob"
    rows: tuple[TextRow, ...]
    ladder: LadderView | None = None  # a served run's, where it has more than one level


def local_generation_screen(comparison: GenerationComparison) -> GenerationScreen:
    from ...core.terminal.generation_text import generation_verdict, split_words

    rows = []
    for t in comparison.texts:
        batched, single = split_words(t)
        single_run, batched_run = (
            RunText(f"{run} ({len(getattr(t, run).token_ids)} tokens)", tuple(continuation_tokens(t, run)))
            for run in ("single", "batched")
        )
        split = t.split
        rows.append(
            TextRow(
                line=t.line,
                split_cell="same" if t.split_step is None else f"{t.split_step}{' tie' if t.near_tie else ''}",
                words=(batched, single),
                runs=(single_run, batched_run),
                curve=step_curve(t),
                upto=f"steps 0–{t.split_step}, up to the split" if t.differs else "every step",
                about=f"text {t.line}: {describe_split(t)}, batched and alone",
                split_top=None if split is None else (split.topk_batch, split.topk_single),
                checks=local_checks(t),
            )
        )
    return GenerationScreen(
        generation_verdict(comparison),
        ("batched", "single"),
        ("next-token max|Δ|", "single run's top-1 margin"),
        "logit",
        tuple(rows),
    )
