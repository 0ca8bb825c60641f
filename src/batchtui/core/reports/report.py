"""The JSON report of a comparison (docs/json.md's schema), the pieces the generation and remedies
reports share with it, and writing any report: atomically to a file, or to standard output."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict
from pathlib import Path

from ..errors import InputError
from ..numbers.comparison import Comparison, FirstOp, ModuleMetrics, PositionMetrics, TextResult, TopToken
from ..safe_files import is_standard_output, write_fresh, write_text


def number(value: float) -> float | None:
    """JSON has no NaN or infinity; such a value is written as null."""
    return value if math.isfinite(value) else None


def _top(tokens: tuple[TopToken, ...]) -> list[list]:
    return [[t.id, t.token, number(t.logit)] for t in tokens]


def position_json(p: PositionMetrics) -> dict:
    return {
        "index": p.index,
        "token": p.token,
        "token_id": p.token_id,
        "max_abs_diff": number(p.max_abs_diff),
        "mean_abs_diff": number(p.mean_abs_diff),
        "kl": number(p.kl),
        "top1_flip": p.top1_flip,
        "margin": number(p.margin),
        "allclose": p.allclose,
        "max_abs_diff_ulp": number(p.max_abs_diff_ulp),
        "topk_batch": _top(p.topk_batch),
        "topk_single": _top(p.topk_single),
        "topk_batch_probs": [number(t.prob) for t in p.topk_batch],
        "topk_single_probs": [number(t.prob) for t in p.topk_single],
    }


def _hidden(metrics: tuple[ModuleMetrics, ...], key: str) -> list[dict]:
    return [
        {
            key: m.name,
            "index": m.index,
            "max_abs_diff": number(m.max_abs_diff),
            "rel_l2": number(m.rel_l2),
            "bitwise_equal": m.bitwise_equal,
            "kind": m.kind,
            "role": m.role,
        }
        for m in metrics
    ]


def _text(t: TextResult) -> dict:
    first = t.first_divergent_layer
    first_module = t.first_divergent_module
    extra: dict[str, object] = {}
    if t.modules:
        extra["modules"] = _hidden(t.modules, "module")
        extra["first_divergent_module"] = first_module.name if first_module else None
    if t.decomposition is not None:
        extra["decomposition"] = {
            k: number(v) if isinstance(v, float) else v for k, v in asdict(t.decomposition).items()
        }
    if t.reference is not None:
        extra["reference"] = {
            "batched_vs_float64": number(t.reference.batched),
            "single_vs_float64": number(t.reference.single),
        }
    return {
        "index": t.index,
        "line": t.line,
        "text": t.text,
        "tokens": list(t.tokens),
        "token_ids": list(t.token_ids),
        "allclose": t.allclose,
        "truncated": t.truncated,
        "max_abs_diff": number(t.max_abs_diff),
        "kl_max": number(t.kl_max),
        "top1_flips": t.top1_flips,
        "worst_position": t.worst_position,
        "max_abs_diff_ulp": number(t.max_abs_diff_ulp),
        "first_divergent_layer": first.name if first else None,
        "positions": [position_json(p) for p in t.positions],
        "layers": _hidden(t.layers, "layer"),
        "routing_changes": [
            {
                "position": c.position,
                "layer": c.layer,
                "router": c.router,
                "experts_batched": list(c.experts_batched),
                "experts_single": list(c.experts_single),
            }
            for c in t.routing_changes
        ],
        **({} if t.first_op is None else {"first_op": first_op_json(t.first_op)}),
        **extra,
    }


def first_op_json(op: FirstOp, runs: tuple[str, str] = ("single", "batched")) -> dict:
    """`op` as JSON; `runs` names its two runs' input shapes (`shape_single`, `shape_batched`)."""
    return {
        "op": op.op,
        "module": op.module,
        f"shape_{runs[0]}": [list(s) for s in op.shape_single],
        f"shape_{runs[1]}": [list(s) for s in op.shape_batched],
        "max_abs_diff": number(op.max_abs_diff),
        "kernel_class": op.kernel_class,
        "cause": op.cause(),
    }


def summary_json(comparison: Comparison) -> dict:
    summary = comparison.summary
    return {
        "texts": summary.texts,
        "diverged": summary.diverged,
        "max_abs_diff": number(summary.max_abs_diff),
        "top1_flips": summary.top1_flips,
    }


def reference_json(comparison: Comparison) -> dict | None:
    """The largest distance of the batched and of the single logits to the float64 reference, where measured."""
    measured = [t.reference for t in comparison.texts if t.reference is not None]
    if not measured:
        return None
    return {
        "batched_vs_float64": number(max(r.batched for r in measured)),
        "single_vs_float64": number(max(r.single for r in measured)),
    }


def remedies_json(outcomes, summary_fn) -> list[dict]:
    """Each remedy's entry: whether it acted, its note, and its run's summary (`summary_fn(result)`)."""
    return [_remedy_json(outcome, summary_fn) for outcome in outcomes]


def _remedy_json(outcome, summary_fn) -> dict:
    what = {"remedy": outcome.name, "description": outcome.description, "applied": outcome.applied}
    result = outcome.comparison
    if result is None:  # the remedy could not run here
        return {**what, "note": outcome.note, "summary": None, "config": None}
    entry = {**what, "note": outcome.note, "summary": summary_fn(result), "config": result.config}
    entry["bitwise_equal"] = sum(t.bitwise_equal for t in result.texts)
    reference = reference_json(result) if isinstance(result, Comparison) else None
    if reference is not None:
        entry["reference"] = reference
    return entry


def run_json(result, summary: dict, texts: list[dict]) -> dict:
    """A run's report: its resolved settings, summary, notes, time, per-text entries and where it ran."""
    return {
        "config": result.config,
        "summary": summary,
        "notes": list(result.notes),
        "elapsed_s": result.elapsed_s,
        "texts": texts,
        "environment": run_environment(result.config, [t.text for t in result.texts]),
    }


def run_environment(config: dict, texts: list[str]) -> dict:
    """`environment.environment` for a run's resolved config: a local model's files, or a served model's URL."""
    from .environment import environment

    served = {"url": config["url"], "model": config.get("model")} if "url" in config else None
    return environment(config.get("model"), texts, bool(config.get("invariant")), served)


def to_json_dict(comparison: Comparison) -> dict:
    return run_json(comparison, summary_json(comparison), [_text(t) for t in comparison.texts])


def write_json(data: dict, path: str | Path) -> Path:
    """Write a report atomically (a reader never sees half a report); '-' and a path naming stdout are the
    stream. A report that cannot be written (a full disk) is one InputError line, after the results the
    commands print first."""
    text = _json_text(data)
    try:
        if is_standard_output(path):
            sys.stdout.write(text)
            sys.stdout.flush()
            return Path("-")
        return write_text(path, text)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise InputError(f"cannot write the report to {path}: {exc.strerror or exc}") from exc


def write_fresh_json(data: dict, path: Path) -> Path:
    """Write a report to `path`, which must not exist (FileExistsError): never over another file."""
    return write_fresh(path, _json_text(data))


# json escapes C0 controls itself; these it writes raw, and a terminal showing the report would act on them.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _finite(value):
    """`value` with every NaN and infinity as null (`number`), however deep: a server's NaN logprob or an
    infinite ratio never makes a report that JSON readers refuse."""
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _json_text(data: dict) -> str:
    """Readable UTF-8 JSON in which no character a terminal acts on appears raw (only inside strings can
    they occur, where a \\u escape means the same)."""
    try:
        text = json.dumps(data, ensure_ascii=False, indent=1, allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere (a server's logprob, a ratio past any float): walked, as null
        text = json.dumps(_finite(data), ensure_ascii=False, indent=1, allow_nan=False)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"
