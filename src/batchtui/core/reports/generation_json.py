"""A `GenerationComparison` as JSON (its table and verdict: `terminal.generation_text`)."""

from __future__ import annotations

from ..numbers.generation_result import Continuation, GenerationComparison, TextGeneration
from ..numbers.importance import ImportanceMetrics, SequenceLogprobs
from ..numbers.trl_parts import TrlParts
from .report import first_op_json, number, position_json, run_json


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
        "trainer_vs_sampler": None if t.vs_trainer is None else _vs_trainer(t, t.vs_trainer),
    }


def importance_json(metrics: ImportanceMetrics) -> dict:
    """The metrics (`numbers.importance`), floats as `number` writes them, and whether every ratio is exactly 1."""
    return {
        **{k: number(v) if isinstance(v, float) else v for k, v in metrics.as_dict().items()},
        "bitwise": metrics.bitwise,
    }


def _vs_trainer(t: TextGeneration, seq: SequenceLogprobs) -> dict:
    return {
        **importance_json(seq.metrics),
        "first_differing_step": seq.first_differing_step,
        "first_module": t.vs_trainer_module,
        **({} if t.vs_trainer_op is None else {"first_op": first_op_json(t.vs_trainer_op, ("sampler", "trainer"))}),
        "trainer_logprobs": [number(v) for v in seq.trainer],
        "sampler_logprobs": [number(v) for v in seq.sampler],
    }


def generation_summary_json(comparison: GenerationComparison) -> dict:
    s = comparison.summary
    overall = comparison.trainer_vs_sampler
    return {
        "texts": s.texts,
        "differ": s.differ,
        "near_ties": s.near_ties,
        "max_abs_diff": number(s.max_abs_diff),
        "trainer_vs_sampler": None if overall is None else importance_json(overall),
        "trl_parts": None if comparison.trl_parts is None else trl_parts_json(comparison.trl_parts),
    }


def generation_json(comparison: GenerationComparison) -> dict:
    return run_json(comparison, generation_summary_json(comparison), [_text(t) for t in comparison.texts])


def trl_parts_json(parts: TrlParts) -> dict:
    return {"tokens": parts.tokens, "by_positions": parts.by_positions,
            "max_by_positions": number(parts.max_by_positions), "by_head": parts.by_head,
            "max_by_head": number(parts.max_by_head)}  # fmt: skip
