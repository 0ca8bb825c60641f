"""Rendering a `Comparison`: the JSON report (DESIGN.md's schema) and the CLI's plain-text table."""

from __future__ import annotations

import json
import math
import os
import tempfile
import unicodedata
from pathlib import Path

from core.comparison import Comparison, PositionMetrics, TextResult, TopToken


def _number(value: float) -> float | None:
    """JSON has no NaN or infinity; such a value is written as null."""
    return value if math.isfinite(value) else None


def _top(tokens: tuple[TopToken, ...]) -> list[list]:
    return [[t.id, t.token, _number(t.logit)] for t in tokens]


def _position(p: PositionMetrics) -> dict:
    return {
        "index": p.index,
        "token": p.token,
        "token_id": p.token_id,
        "max_abs_diff": _number(p.max_abs_diff),
        "mean_abs_diff": _number(p.mean_abs_diff),
        "kl": _number(p.kl),
        "top1_flip": p.top1_flip,
        "margin": _number(p.margin),
        "allclose": p.allclose,
        "topk_batch": _top(p.topk_batch),
        "topk_single": _top(p.topk_single),
        "topk_batch_probs": [_number(t.prob) for t in p.topk_batch],
        "topk_single_probs": [_number(t.prob) for t in p.topk_single],
    }


def _text(t: TextResult) -> dict:
    first = t.first_divergent_layer
    return {
        "index": t.index,
        "text": t.text,
        "tokens": list(t.tokens),
        "token_ids": list(t.token_ids),
        "allclose": t.allclose,
        "max_abs_diff": _number(t.max_abs_diff),
        "kl_max": _number(t.kl_max),
        "top1_flips": t.top1_flips,
        "worst_position": t.worst_position,
        "first_divergent_layer": first.layer if first else None,
        "positions": [_position(p) for p in t.positions],
        "layers": [
            {
                "layer": layer.layer,
                "index": layer.index,
                "max_abs_diff": _number(layer.max_abs_diff),
                "rel_l2": _number(layer.rel_l2),
                "bitwise_equal": layer.bitwise_equal,
            }
            for layer in t.layers
        ],
    }


def to_json_dict(comparison: Comparison) -> dict:
    summary = comparison.summary
    return {
        "config": comparison.config,
        "summary": {
            "texts": summary.texts,
            "diverged": summary.diverged,
            "max_abs_diff": _number(summary.max_abs_diff),
            "top1_flips": summary.top1_flips,
        },
        "notes": list(comparison.notes),
        "elapsed_s": comparison.elapsed_s,
        "texts": [_text(t) for t in comparison.texts],
    }


def write_json(comparison: Comparison, path: str | Path) -> Path:
    """Write the report atomically (temp file + rename): a reader never sees half a report."""
    path = Path(path)
    text = json.dumps(to_json_dict(comparison), ensure_ascii=False, indent=1)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def literal(text: str, width: int | None = None) -> str:
    """`text` made safe for one line of a terminal: control characters shown as escapes."""
    shown = "".join(repr(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)
    if width is not None and len(shown) > width:
        shown = shown[: width - 1] + "…"
    return shown


def format_float(value: float) -> str:
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.2e}"


TABLE_HEADER = ("#", "text", "tokens", "max|Δ|", "KL max", "flips", "worst pos", "allclose")


def table_rows(comparison: Comparison) -> list[tuple[str, ...]]:
    return [
        (
            str(t.index + 1),
            literal(t.text, 32),
            str(len(t.token_ids)),
            format_float(t.max_abs_diff),
            format_float(t.kl_max),
            str(t.top1_flips),
            str(t.worst_position),
            "yes" if t.allclose else "NO",
        )
        for t in comparison.texts
    ]


def format_table(comparison: Comparison) -> str:
    rows = [TABLE_HEADER, *table_rows(comparison)]
    widths = [max(len(row[c]) for row in rows) for c in range(len(TABLE_HEADER))]
    numeric = {0, 2, 3, 4, 5, 6}
    lines = []
    for r, row in enumerate(rows):
        cells = [cell.rjust(w) if c in numeric else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if r == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(comparison: Comparison) -> str:
    s = comparison.summary
    c = comparison.config
    setup = (
        f"{c['model']}, {c['dtype']} on {c['device']}, attn {c['attn']}, batch size {c['batch_size']}, "
        f"{c['padding_side']} padding, {c['positions']} positions, atol {c['atol']:g} rtol {c['rtol']:g}"
    )
    if s.diverged == 0:
        return f"OK: all {s.texts} texts allclose (max|Δ| {format_float(s.max_abs_diff)}) [{setup}]"
    return (
        f"DIVERGED: {s.diverged} of {s.texts} texts not allclose, max|Δ| {format_float(s.max_abs_diff)}, "
        f"{s.top1_flips} top-1 flips [{setup}]"
    )
