"""A `GenerationComparison` in plain text: the CLI's table, its verdict, the tokens at each split."""

from __future__ import annotations

from ..numbers.generation import GenerationComparison, TextGeneration
from ..visible import literal
from .plain import format_columns, format_float


def split_words(t: TextGeneration) -> tuple[str, str]:
    """The two runs' tokens at the split: `'e'` batched, `'the'` single (empty without a split)."""
    if t.split_step is None:
        return "", ""
    chosen = t.batched.token_ids[t.split_step], t.single.token_ids[t.split_step]
    return tuple(literal(repr(t.steps.token_texts[i])) for i in chosen)  # the engine decodes every chosen id


def format_generation_table(comparison: GenerationComparison) -> str:
    header = ("#", "text", "prompt", "new S/B", "split", "batched →", "single →", "margin", "max|Δ|", "near-tie")
    table = format_columns(header, [_generation_row(t) for t in comparison.texts], left={1, 5, 6, 9})
    measured = [t for t in comparison.texts if t.vs_trainer is not None]
    if not measured:
        return table
    header = ("#", "trainer vs sampler", "tokens", "max|δ|", "mean|δ|", "kl", "ratio min", "ratio max", "clip", "first")
    return table + "\n\n" + format_columns(header, [_trainer_row(t) for t in measured], left={1})


def _trainer_row(t: TextGeneration) -> tuple[str, ...]:
    m = t.vs_trainer.metrics
    first = t.vs_trainer.first_differing_step
    return (
        str(t.line),
        literal(t.text, 24),
        str(m.tokens),
        format_float(m.max_abs_diff),
        format_float(m.mean_abs_diff),
        format_float(m.kl),
        f"{m.ratio_min:.6f}",  # (a ratio near 1 needs its digits: 0.999993 and 1.000007 are not "1")
        f"{m.ratio_max:.6f}",
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
    measured = [t for t in comparison.texts if t.vs_prefill is not None]
    if measured:
        apart = [t for t in measured if not t.vs_prefill.bitwise]
        verdict += f"; decode vs prefill (alone): {len(measured) - len(apart)} of {len(measured)} texts bitwise"
        if apart:
            # the earliest step any text parts at (the first text on a tie), not the first text's
            first = min(apart, key=lambda t: t.vs_prefill.first_differing_step)
            largest = max(max(t.vs_prefill.max_abs_diff) for t in apart)
            verdict += (
                f", text {first.line} first differs at step {first.vs_prefill.first_differing_step}"
                + (f" in {first.vs_prefill.first_module}" if first.vs_prefill.first_module else "")
                + f" (max|Δ| up to {format_float(largest)})"
            )
    return verdict + _trainer_verdict(comparison)


def _trainer_verdict(comparison: GenerationComparison) -> str:
    """The sampler (the batched decode) against the trainer's forward, over every token."""
    overall = comparison.trainer_vs_sampler
    if overall is None:
        return ""
    measured = [t for t in comparison.texts if t.vs_trainer is not None]
    same = sum(t.vs_trainer.first_differing_step is None for t in measured)
    words = f"; trainer vs sampler: {same} of {len(measured)} texts bitwise"
    if overall.bitwise:
        return words + " (every ratio exactly 1, every metric 0)"
    words += (
        f", max|δ| {format_float(overall.max_abs_diff)}, kl {format_float(overall.kl)}, ratio "
        f"{overall.ratio_min:.6f}-{overall.ratio_max:.6f}, clipped {overall.clip_fraction:.1%}, "
        f"top-1 differs at {overall.top1_disagree} of {overall.tokens} tokens"
    )
    parted = [t for t in measured if t.vs_trainer.first_differing_step is not None]
    if not parted:
        return words
    first = min(parted, key=lambda t: t.vs_trainer.first_differing_step)  # the earliest (the first text on a tie)
    where = f" in {first.vs_trainer_module}" if first.vs_trainer_module else ""
    if first.vs_trainer_op is not None:
        where += f", first at {first.vs_trainer_op.words()}: {first.vs_trainer_op.cause()}"
    return words + f"; earliest at step {first.vs_trainer.first_differing_step} (text {first.line}){where}"
