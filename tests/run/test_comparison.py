"""The result dataclasses: columns whose top-k reach Python on their first read are the columns given whole."""

import pytest
import torch

from batchtui.core.numbers.comparison import DeferredColumns, PositionColumns

TOKENS = {i: f"t{i}" for i in range(10)}


def _columns(n: int, offset: int) -> dict:
    """Per-position numbers of a text of n positions; its top-2 ids and values differ from one position to the next."""
    top = tuple((offset + t) % 10 for t in range(n))
    return {
        "token_ids": top,
        "max_abs_diff": tuple(0.5 * t for t in range(n)),
        "max_abs_diff_ulp": (1.0,) * n,
        "mean_abs_diff": (0.25,) * n,
        "kl": (0.0,) * n,
        "top1_flip": (False,) * n,
        "margin": (0.125,) * n,
        "allclose": (True,) * n,
        **{
            name: tuple((float(offset + t), float(-t)) for t in range(n))
            for name in ("topk_batch_logits", "topk_batch_probs", "topk_batch_probs_in_single", "topk_single_logits")
        },
        **{
            name: tuple((float(t), 0.5) for t in range(n))
            for name in ("topk_single_probs", "topk_single_probs_in_batch")
        },
        "topk_batch_ids": tuple((i, (i + 1) % 10) for i in top),
        "topk_single_ids": tuple(((i + 1) % 10, i) for i in top),
    }


def test_deferred_top_k_columns_are_the_columns_given_whole_for_each_text_of_a_group():
    lengths, starts = [3, 1, 4], [0, 3, 4]
    texts = [_columns(n, 10 * i) for i, n in enumerate(lengths)]
    top_k = [name for name in PositionColumns.measured() if name.startswith("topk_")]
    # The group's arrays: the texts' top-k rows one after another, as the metrics return them.
    arrays = {name: torch.tensor([row for text in texts for row in text[name]]) for name in top_k}
    for text, start, n in zip(texts, starts, lengths):
        whole = PositionColumns(**text, token_texts=TOKENS)
        eager = {name: value for name, value in text.items() if name not in top_k}
        deferred = PositionColumns.deferring(DeferredColumns(arrays, start, start + n), **eager, token_texts=TOKENS)
        assert deferred.topk_single_ids == whole.topk_single_ids  # the first read converts every deferred column
        assert "_deferred" not in vars(deferred)  # and the text holds the group's arrays no longer
        assert deferred == whole and deferred.rows() == whole.rows()
        assert all(type(getattr(deferred, name)[0][0]) is type(getattr(whole, name)[0][0]) for name in top_k)
    assert PositionColumns.deferring(DeferredColumns(arrays, 0, 3), **eager, token_texts=TOKENS) != whole
    assert not hasattr(PositionColumns.deferring(DeferredColumns(arrays, 0, 3), **eager, token_texts=TOKENS), "x")
    del eager["kl"]
    with pytest.raises(TypeError, match="kl"):
        PositionColumns.deferring(DeferredColumns(arrays, 0, 3), **eager, token_texts=TOKENS)
