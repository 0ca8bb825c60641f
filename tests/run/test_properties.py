"""Property tests over random texts and settings on the built-in model: no crash, invariants hold."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchtui.core import Settings, compare
from batchtui.core.models.loading import load_model

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

# Any printable text, emoji, CJK, right-to-left, combining marks, control characters, markup-like brackets.
texts = st.text(min_size=1, max_size=40).filter(lambda t: t.strip())
run_settings = st.builds(
    Settings,
    model=st.just("tiny"),
    dtype=st.sampled_from(["bfloat16", "float32"]),
    batch_size=st.integers(1, 5),
    padding_side=st.sampled_from(["left", "right"]),
    positions=st.sampled_from(["mask", "arange"]),
    top_k=st.integers(1, 8),
)
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(texts, min_size=1, max_size=6), run_settings)
def test_any_texts_and_settings_measure_without_error(batch, run):
    result = compare(batch, run)
    tokenizer = load_model(run).tokenizer
    assert [t.text for t in result.texts] == batch
    for text, source in zip(result.texts, batch):
        assert list(text.token_ids) == tokenizer(source)["input_ids"]  # reported tokens are its own
        assert len(text.positions) == len(text.token_ids)
        assert text.max_abs_diff >= 0 and all(p.kl >= 0 for p in text.positions)
        assert all(len(p.topk_batch) == min(run.top_k, 512) for p in text.positions)


@FAST
@given(st.lists(texts, min_size=1, max_size=5), st.sampled_from(["bfloat16", "float32"]))
def test_batch_size_one_is_always_bitwise_equal(batch, dtype):
    result = compare(batch, Settings(model="tiny", dtype=dtype, batch_size=1))
    assert all(t.max_abs_diff == 0.0 and t.allclose for t in result.texts)


@pytest.mark.slow
@FAST
@given(texts, st.lists(texts, min_size=1, max_size=3), run_settings)
def test_duplicate_texts_in_one_batch_match_the_models_own_rows(tiny_path, repeated, others, run):
    """Duplicates get equal rows exactly when the model's batched rows for them are bitwise equal.

    (On the CPU a GEMM may treat rows in a tail block differently, so equal rows are the model's to
    give, not a given; what the engine reports must match the model either way.)
    """
    import torch
    from helpers.oracle import seed_compare

    batch = [repeated, *others, repeated]
    result = compare(batch, run.with_changes(batch_size=len(batch), positions="mask"))
    oracle = seed_compare(tiny_path, batch, getattr(torch, run.dtype), run.padding_side)
    assert [t.max_abs_diff for t in result.texts] == [o.max_abs_diff for o in oracle]
    first, last = result.texts[0], result.texts[-1]
    rows_equal = torch.equal(oracle[0].batched, oracle[-1].batched)
    assert (first.columns == last.columns) == rows_equal
