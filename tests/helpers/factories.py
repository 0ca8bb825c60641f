"""Synthetic results for the view tests: a `Comparison` built from per-position numbers the test chooses, so
that what a view computes is checked against a case with a known answer, no model run."""

from __future__ import annotations

from batchtui.core.numbers.comparison import Comparison, ModuleMetrics, PositionColumns, TextResult

VOCABULARY = {i: f"t{i}" for i in range(16)}


def make_text(index: int, max_abs_diff: list[float], flips: set[int] = frozenset(), atol: float = 1e-5) -> TextResult:
    """A text whose position t differs by max_abs_diff[t] (not allclose above atol) and flips where listed; each
    position's top-2 are tokens 1 and 2 (swapped in the batched run at a flip)."""
    n = len(max_abs_diff)
    close = tuple(d <= atol for d in max_abs_diff)
    flip = tuple(t in flips for t in range(n))
    single_top = ((1, 2),) * n
    batch_top = tuple((2, 1) if f else (1, 2) for f in flip)
    columns = PositionColumns(
        token_ids=tuple(3 + t % 10 for t in range(n)),
        max_abs_diff=tuple(max_abs_diff),
        max_abs_diff_ulp=tuple(d / 0.0625 for d in max_abs_diff),
        mean_abs_diff=tuple(d / 4 for d in max_abs_diff),
        kl=tuple(d * d for d in max_abs_diff),
        top1_flip=flip,
        margin=(0.125,) * n,
        allclose=close,
        topk_batch_ids=batch_top,
        topk_batch_logits=((10.0, 9.875),) * n,
        topk_batch_probs=((0.5, 0.4),) * n,
        topk_batch_probs_in_single=((0.4, 0.5),) * n,
        topk_single_ids=single_top,
        topk_single_logits=((10.0, 9.875),) * n,
        topk_single_probs=((0.5, 0.4),) * n,
        topk_single_probs_in_batch=((0.4, 0.5),) * n,
        token_texts=VOCABULARY,
    )
    worst = max(range(n), key=lambda t: max_abs_diff[t])
    logits = ModuleMetrics(1, "logits", max(max_abs_diff), 0.0, max(max_abs_diff) == 0, "logits")
    return TextResult(
        index=index,
        text=f"text {index}",
        token_ids=columns.token_ids,
        tokens=tuple(VOCABULARY[i] for i in columns.token_ids),
        allclose=all(close),
        max_abs_diff=max(max_abs_diff),
        kl_max=max(columns.kl),
        top1_flips=sum(flip),
        worst_position=worst,
        max_abs_diff_ulp=max(columns.max_abs_diff_ulp),
        columns=columns,
        layers=(ModuleMetrics(0, "model.embed_tokens", 0.0, 0.0, True, "embedding"), logits),
        line=index + 1,
    )


def make_comparison(*texts: TextResult, batch_size: int = 8) -> Comparison:
    return Comparison(config={"batch_size": batch_size, "dtype": "bfloat16", "device": "cpu"}, texts=texts)
