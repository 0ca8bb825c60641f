"""Where a text's runs part, as a curve over its modules (points, marks, labels); routing changes at a position."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.numbers.comparison import ModuleMetrics, RoutingChange, TextResult


@dataclass(frozen=True)
class LayerCurve:
    """Per-layer (or per-module) divergence of one text as log10(max|Δ|); bitwise-equal ones apart."""

    names: tuple[str, ...]
    log10_max_abs_diff: tuple[float | None, ...]  # None where the module is bitwise equal (or 0)
    rel_l2: tuple[float, ...]
    first_divergent: str | None
    tick_indices: tuple[int, ...]  # where to label the x axis: embeddings, each layer's output, norm
    tick_labels: tuple[str, ...]  # a short label per module: "emb", the layer's number, "norm", "out"
    marks: tuple[str, ...]  # a letter per module saying what it is (MODULE_MARKS), for the per-module view


# The per-module view draws each module as a letter: what each point is, without a name per point.
MODULE_MARKS = {"attention": "a", "MLP": "m", "norm": "n", "router": "r"}


LAYER_MARKS = {"embedding": "e", "layer": "L", "final": "f", "logits": "o"}


OTHER_MARK = "s"  # a sub-module of no known role


MARK_LEGEND = "e emb · a attn · m MLP · n norm · r router · s other · L layer · f final norm · o logits"


def module_mark(module: ModuleMetrics) -> str:
    if module.kind == "sub":
        return MODULE_MARKS.get(module.role or "", OTHER_MARK)
    return LAYER_MARKS.get(module.kind, OTHER_MARK)


def short_module_label(module: ModuleMetrics) -> str:
    """An x-axis label: the layer's own number for a layer, the last part of the name otherwise."""
    if module.kind == "layer":
        return module.name.rsplit(".", 1)[-1]
    return {"embedding": "emb", "final": "norm", "logits": "out"}.get(module.kind, module.name.rsplit(".", 1)[-1])


def layer_curve(text: TextResult, modules: bool = False) -> LayerCurve:
    metrics = text.modules if modules and text.modules else text.layers
    first = next((m for m in metrics if not m.bitwise_equal), None)
    return LayerCurve(
        names=tuple(m.name for m in metrics),
        log10_max_abs_diff=tuple(math.log10(m.max_abs_diff) if m.max_abs_diff > 0 else None for m in metrics),
        rel_l2=tuple(m.rel_l2 for m in metrics),
        first_divergent=first.name if first else None,
        tick_indices=tuple(i for i, m in enumerate(metrics) if m.kind != "sub"),
        tick_labels=tuple(short_module_label(m) for m in metrics),
        marks=tuple(module_mark(m) for m in metrics),
    )


def fitted_labels(positions: list[int], labels: list[str], points: int, columns: int) -> list[str]:
    """Axis labels at `positions` (of `points` spread evenly over `columns` columns), left to right, each
    blanked where it would touch the label kept before it: every tick stays, as many labels as fit are read."""
    scale = (columns - 1) / max(points - 1, 1)
    kept = []
    free_from = None  # the first column after the last kept label and a space
    for position, label in zip(positions, labels):
        start = round(position * scale) - len(label) // 2
        fits = free_from is None or start >= free_from
        kept.append(label if fits else "")
        if fits:
            free_from = start + len(label) + 1
    return kept


def routing_changes_at(text: TextResult, position: int) -> tuple[RoutingChange, ...]:
    """The MoE routing changes of one token of a text (one per layer whose router chose otherwise)."""
    return tuple(change for change in text.routing_changes if change.position == position)
