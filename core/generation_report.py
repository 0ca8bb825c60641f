"""A `GenerationComparison` as the CLI's table and as JSON."""

from __future__ import annotations

from .generation_result import Continuation, GenerationComparison, TextGeneration
from .plain_text import format_columns, format_float
from .report import number, position_json, run_json
from .visible import literal


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


def _continuation(c: Continuation) -> dict:
    return {"token_ids": list(c.token_ids), "text": c.text, "ended_at_eos": c.ended_at_eos}


def _text(t: TextGeneration) -> dict:
    return {
        "index": t.index,
        "line": t.line,
        "text": t.text,
        "prompt_tokens": t.prompt_tokens,
        "truncated": t.truncated,
        "differs": t.differs,
        "split_step": t.split_step,
        "near_tie": t.near_tie,
        "max_abs_diff": number(t.max_abs_diff),
        "single": _continuation(t.single),
        "batched": _continuation(t.batched),
        # Up to the split (inclusive): both runs read the same prefix. After it they diverged.
        "steps": [position_json(p) for p in t.step_metrics],
        "vs_prefill": None
        if t.vs_prefill is None
        else {
            "steps": len(t.vs_prefill.max_abs_diff),
            "max_abs_diff": [number(d) for d in t.vs_prefill.max_abs_diff],
            "first_differing_step": t.vs_prefill.first_differing_step,
            "first_module": t.vs_prefill.first_module,
            "bitwise": t.vs_prefill.bitwise,
        },  # fmt: skip
    }


def generation_summary_json(comparison: GenerationComparison) -> dict:
    s = comparison.summary
    return {"texts": s.texts, "differ": s.differ, "near_ties": s.near_ties, "max_abs_diff": number(s.max_abs_diff)}


def generation_json(comparison: GenerationComparison) -> dict:
    return run_json(comparison, generation_summary_json(comparison), [_text(t) for t in comparison.texts])
