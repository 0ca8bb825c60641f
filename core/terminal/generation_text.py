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
    return format_columns(header, [_generation_row(t) for t in comparison.texts], left={1, 5, 6, 9})


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
            first = apart[0]
            largest = max(max(t.vs_prefill.max_abs_diff) for t in apart)
            verdict += (
                f", text {first.line} first differs at step {first.vs_prefill.first_differing_step}"
                + (f" in {first.vs_prefill.first_module}" if first.vs_prefill.first_module else "")
                + f" (max|Δ| up to {format_float(largest)})"
            )
    return verdict
