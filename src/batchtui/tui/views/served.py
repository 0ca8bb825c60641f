"""What the app's generation view draws for a served model (`batchtui --url`): under load against alone, in the
same shapes as a local generation (`views.generation_screen.GenerationScreen`)."""

from __future__ import annotations

import math

from ...core.endpoint.report import endpoint_verdict, split_at
from ...core.endpoint.result import ContinuationSplit, EndpointComparison, ServedText
from ...core.numbers.comparison import TopToken
from ...core.run.backend import ServedContinuation
from ...core.terminal.plain import counted, format_float
from .generation_screen import ContinuationToken, GenerationScreen, LadderView, RunText, StepCurve, TextRow


def endpoint_screen(comparison: EndpointComparison) -> GenerationScreen:
    unit = "tokens" if comparison.config.get("steps_in") == "tokens" else "characters"
    return GenerationScreen(
        endpoint_verdict(comparison),
        ("load", "alone"),
        ("|Δ logprob| of the alone run's token", "alone run's top-1 margin"),
        "logprob",
        tuple(_row(t, unit) for t in comparison.texts),
        _ladder(comparison),
    )


def _ladder(comparison: EndpointComparison) -> LadderView | None:
    levels = comparison.ladder
    if len(levels) < 2:
        return None
    first = comparison.first_breaking_concurrency
    moved = max(level.max_abs_logprob_diff for level in levels)
    caption = (
        f"concurrency ladder, {levels[0].rounds} round{'s' * (levels[0].rounds != 1)} a level: "
        + ("no level breaks" if first is None else f"first breaks at {first}")
        + (f" · max|Δlp| {format_float(moved)}" if moved else "")
    )
    return LadderView(
        tuple(level.concurrency for level in levels),
        tuple(level.texts_split for level in levels),
        tuple(level.texts_logprobs_differ for level in levels),
        caption,
    )


def checks_words(t: ServedText) -> str:
    """The text's served checks beside the ladder, in words (empty where none was measured)."""
    words = []
    if t.prefill_decode is not None:
        p = t.prefill_decode
        words.append(
            "prefill vs decode: bitwise"
            if p.first_differing_step is None
            else f"prefill vs decode: apart from token {p.first_differing_step}, "
            f"max|Δlp| {format_float(p.max_abs_diff)}"
        )
    if t.prefix_cache is not None:
        c = t.prefix_cache
        cached = "hit unknown" if c.cached_tokens is None else f"{c.cached_tokens} tokens cached"
        outcome = "differs" if c.differs else "the same"
        words.append(f"prefix cache ({cached}): {outcome}")
    if t.served_vs_local is not None and not t.served_vs_local.steps:
        words.append("vs local: nothing compared (no continuation token)")
    elif t.served_vs_local is not None:
        v = t.served_vs_local
        words.append(
            f"vs local: max|Δlp| {format_float(v.max_abs_diff)}, ratio {format_float(v.ratio_min)}.."
            f"{format_float(v.ratio_max)}"
        )
    return " · ".join(words)


def _row(t: ServedText, unit: str) -> TextRow:
    split = t.split
    shown = None if t.shown_round is None else t.under_load[t.shown_round]
    alone_word, load_word = split_at(t)
    step = None if split is None else split.step
    label = "under load" if t.shown_round is None else f"under load, round {t.shown_round + 1}"  # (counted from 1)
    runs = (_run("alone", t.alone, step, unit), _run(label, shown, step, unit))
    if split is None:
        cell, about = "-", f"text {t.line}: not measured"
    elif step is None and t.logprobs_differ:
        moved = format_float(t.max_abs_diff)
        cell, about = f"Δlp {moved}", f"text {t.line}: the same tokens under load, logprobs apart by up to {moved}"
    elif step is None:
        cell, about = "same", f"text {t.line}: the same alone and under load"
    else:
        tie = " tie" if split.near_tie else ""
        cell, about = f"{step}{tie}", f"text {t.line}: split at {unit[:-1]} {step}{' (near-tie)' if tie else ''}"
    if t.noise is not None:
        about += "; alone twice: " + ("the same" if t.noise.step is None else f"split at {unit[:-1]} {t.noise.step}")
    return TextRow(
        line=t.line,
        split_cell=cell,
        words=(load_word, alone_word),
        runs=runs,
        curve=_curve(split, t.alone) if split is not None and split.logprob_diffs else None,
        upto="up to the split" if step is not None else "every step",
        about=about,
        split_top=_tops(split) if split is not None and split.reference_top else None,
        checks=checks_words(t),
    )


def _run(name: str, continuation: ServedContinuation | None, split: int | None, unit: str) -> RunText:
    if continuation is None:
        return RunText(f"{name}: not measured", ())
    pieces = [s.token for s in continuation.steps] if unit == "tokens" and continuation.steps else continuation.text
    end = len(pieces) if split is None else split
    marked = tuple(
        ContinuationToken(piece, "shared" if i < end else "split" if i == end else "after")
        for i, piece in enumerate(pieces)
    )
    return RunText(f"{name} ({counted(len(pieces), unit.removesuffix('s'))})", marked)


def _curve(split: ContinuationSplit, alone: ServedContinuation) -> StepCurve:
    """Per step up to the split: |Δ logprob| of the alone run's token, and the alone run's top-1 margin."""

    def log10(value: float | None) -> float | None:
        return math.log10(value) if value is not None and value > 0 and math.isfinite(value) else None

    diffs = split.logprob_diffs
    margins = [s.top[0][1] - s.top[1][1] if len(s.top) >= 2 else None for s in alone.steps[: len(diffs)]]
    return StepCurve(
        steps=tuple(range(len(diffs))),
        log10_max_abs_diff=tuple(log10(None if d is None else abs(d)) for d in diffs),
        log10_margin=tuple(log10(m) for m in margins),
    )


def _tops(split: ContinuationSplit) -> tuple[tuple[TopToken, ...], tuple[TopToken, ...]]:
    """Both runs' top-k at the split, under load first, as the top-k table takes them."""

    def tokens(ours, theirs) -> tuple[TopToken, ...]:
        ranks = {token: rank for rank, (token, _) in enumerate(theirs)}
        other = dict(theirs)
        return tuple(
            TopToken(-1, token, lp, math.exp(lp), math.exp(other[token]) if token in other else 0.0, ranks.get(token))
            for token, lp in ours
        )

    return tokens(split.other_top, split.reference_top), tokens(split.reference_top, split.other_top)
