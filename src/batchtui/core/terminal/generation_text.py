"""A `GenerationComparison` in plain text: the CLI's table, its verdict, the tokens at each split."""

from __future__ import annotations

from ..numbers.generation_result import GenerationComparison, TextGeneration
from ..numbers.importance import SequenceLogprobs
from ..visible import literal
from .plain import format_columns, format_float, format_precise
from .trl_parts_text import trl_parts_words


def split_words(t: TextGeneration) -> tuple[str, str]:
    """The two runs' tokens at the split: `'e'` batched, `'the'` single (empty without a split)."""
    if t.split_step is None:
        return "", ""
    # the engine decodes every chosen id
    batched, single = (literal(repr(t.steps.token_texts[run.token_ids[t.split_step]])) for run in (t.batched, t.single))
    return batched, single


def format_generation_table(comparison: GenerationComparison) -> str:
    header = ("#", "text", "prompt", "new S/B", "split", "batched →", "single →", "margin", "max|Δ|", "near-tie")
    table = format_columns(header, [_generation_row(t) for t in comparison.texts], left={1, 5, 6, 9})
    measured = [(t, t.vs_trainer) for t in comparison.texts if t.vs_trainer is not None]
    if not measured:
        return table
    header = ("#", "trainer vs sampler", "tokens", "max|δ|", "mean|δ|", "kl", "ratio min", "ratio max", "clip", "first")
    return table + "\n\n" + format_columns(header, [_trainer_row(t, vs) for t, vs in measured], left={1})


def _trainer_row(t: TextGeneration, vs_trainer: SequenceLogprobs) -> tuple[str, ...]:
    m = vs_trainer.metrics
    first = vs_trainer.first_differing_step
    return (
        str(t.line),
        literal(t.text, 24),
        str(m.tokens),
        format_float(m.max_abs_diff),
        format_float(m.mean_abs_diff),
        format_float(m.kl),
        f"{format_precise(m.ratio_min)}",  # (a ratio near 1 needs its digits: 0.999993 and 1.000007 are not "1")
        f"{format_precise(m.ratio_max)}",
        f"{m.clip_fraction:.0%}",
        "same" if first is None else str(first),
    )


def _generation_row(t: TextGeneration) -> tuple[str, ...]:
    batched, single = split_words(t)
    split = t.split
    return (
        str(t.line),
        literal(t.text, 32),
        f"{t.prompt_tokens} cut" if t.truncated else str(t.prompt_tokens),
        f"{len(t.single.token_ids)}/{len(t.batched.token_ids)}",
        "same" if t.split_step is None else str(t.split_step),
        batched,
        single,
        "" if split is None else format_float(split.margin),
        format_float(t.max_abs_diff),
        "" if split is None else ("yes" if t.near_tie else "no"),
    )


def generation_verdict(comparison: GenerationComparison) -> str:
    s = comparison.summary
    verdict = f"{s.differ} of {s.texts} continuations differ"
    if s.differ:
        verdict += f" ({s.near_ties} at a near-tie: single margin <= 2·max|Δ|)"
    measured = [(t, t.vs_prefill) for t in comparison.texts if t.vs_prefill is not None]
    if measured:
        apart = [(t, vs) for t, vs in measured if not vs.bitwise and vs.first_differing_step is not None]
        verdict += f"; decode vs prefill (alone): {len(measured) - len(apart)} of {len(measured)} texts bitwise"
        if apart:
            # the earliest step any text parts at (the first text on a tie), not the first text's
            first, at = min(apart, key=lambda pair: _step(pair[1].first_differing_step))
            largest = max(max(vs.max_abs_diff) for _, vs in apart)
            verdict += (
                f", text {first.line} first differs at step {at.first_differing_step}"
                + (f" in {at.first_module}" if at.first_module else "")
                + f" (max|Δ| up to {format_float(largest)})"
            )
    return verdict + _trainer_verdict(comparison)


def _trainer_verdict(comparison: GenerationComparison) -> str:
    """The sampler (the batched decode) against the trainer's forward, over every token."""
    overall = comparison.trainer_vs_sampler
    if overall is None:
        return ""
    measured = [(t, t.vs_trainer) for t in comparison.texts if t.vs_trainer is not None]
    same = sum(vs.first_differing_step is None for _, vs in measured)
    words = f"; trainer vs sampler: {same} of {len(measured)} texts bitwise"
    parts = "" if comparison.trl_parts is None else "; " + trl_parts_words(comparison.trl_parts, "the generations'")
    if overall.bitwise:
        return words + " (every ratio exactly 1, every metric 0)" + parts
    words += (
        f", max|δ| {format_float(overall.max_abs_diff)}, kl {format_float(overall.kl)}, ratio "
        f"{format_precise(overall.ratio_min)}-{format_precise(overall.ratio_max)}, "
        f"clipped {overall.clip_fraction:.1%}"
    )
    if overall.top1_disagree is not None:  # (TRL's head gives no top-1)
        words += f", top-1 differs at {overall.top1_disagree} of {overall.tokens} tokens"
    parted = [(t, vs) for t, vs in measured if vs.first_differing_step is not None]
    if parted:
        first, at = min(parted, key=lambda pair: _step(pair[1].first_differing_step))  # the earliest (first on a tie)
        where = f" in {first.vs_trainer_module}" if first.vs_trainer_module else ""
        if first.vs_trainer_op is not None:
            where += f", first at {first.vs_trainer_op.words()}: {first.vs_trainer_op.cause()}"
        words += f"; earliest at step {at.first_differing_step} (text {first.line}){where}"
    return words + parts


def _step(step: int | None) -> int:
    """A step where two runs part (the lists above hold only texts that part)."""
    assert step is not None
    return step
