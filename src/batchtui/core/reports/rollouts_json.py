"""A `RolloutsSummary` as JSON: `{"config", "rollouts": {...}}` (its table and verdict: `terminal.rollouts_text`)."""

from __future__ import annotations

from ..numbers.rollouts_summary import BatchNoise, DeltaBand, Histogram, RolloutsSummary, ScoredToken
from .generation_json import importance_json, trl_parts_json
from .report import number


def rollouts_json(summary: RolloutsSummary) -> dict:
    return {
        "config": summary.config,
        "rollouts": {
            **importance_json(summary.metrics),
            "abs_diff_percentiles": {name: number(v) for name, v in summary.abs_diff_percentiles.items()},
            "delta_histogram": _histogram(summary.delta_histogram),
            "ratio_histogram": _histogram(summary.ratio_histogram),
            "worst_sequences": [
                {
                    "line": s.line,
                    "tokens": len(s.tokens),
                    "log_ratio": number(s.log_ratio),
                    "max_abs_diff": number(s.max_abs_diff),
                    "completion": s.completion,
                    "steps": [_token(t) for t in s.tokens],
                }
                for s in summary.worst_sequences
            ],
            "worst_tokens": [{"line": w.line, **_token(w.token)} for w in summary.worst_tokens],
            "by_position": [_band(b) for b in summary.by_position],
            "by_entropy": [_band(b) for b in summary.by_entropy],
            "max_kl": number(summary.max_kl) if summary.max_kl is not None else None,
            "kl_within": summary.kl_within,
            "batch_noise": None if summary.batch_noise is None else _noise(summary.batch_noise),
            "trl_parts": None if summary.trl_parts is None else trl_parts_json(summary.trl_parts),
            "masked_tokens": summary.masked_tokens,
            "by_step": [{"step": key, **importance_json(m)} for key, m in summary.by_step],
            "by_group": [{"group": key, **importance_json(m)} for key, m in summary.by_group],
            "skipped": summary.skipped,
            "faults": list(summary.faults),
            "resumed": summary.resumed,
            "elapsed_s": number(summary.elapsed_s),
        },
    }


def _histogram(h: Histogram) -> dict:
    return {"edges": [number(e) for e in h.edges], "counts": list(h.counts)}


def _token(t: ScoredToken) -> dict:
    return {
        "step": t.step,
        "token_id": t.token_id,
        "token": t.token,
        "trainer_logprob": number(t.trainer),
        "sampler_logprob": number(t.sampler),
        "delta": number(t.delta),
        "ratio": number(t.ratio),
        "top1_disagree": t.top1_disagree,
        "sampler_top1": t.sampler_top1,
    }


def _band(b: DeltaBand) -> dict:
    """A band [low, high) of |δ| (`high` null for the last, open one)."""
    high = None if b.high == float("inf") else number(b.high)
    return {"low": number(b.low), "high": high, "tokens": b.tokens, "mean_abs_diff": number(b.mean_abs_diff),
            "max_abs_diff": number(b.max_abs_diff)}  # fmt: skip


def _noise(noise: BatchNoise) -> dict:
    return {"lines": list(noise.lines), "tokens": noise.tokens, "moved": noise.moved,
            "max_abs_diff": number(noise.max_abs_diff), "moved_in_mode": noise.moved_in_mode}  # fmt: skip
