"""Properties any correct batched-vs-single comparison must have."""

import re

import pytest
import torch
from conftest import MIXED_TEXTS
from helpers.oracle import seed_compare
from transformers import AutoTokenizer

from batchtui.core import Cancelled, InputError, Settings, compare
from batchtui.core.run.skeleton import running_stage, total_passes

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_batch_size_one_is_bitwise_equal(dtype):
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype=dtype, batch_size=1))
    for text in result.texts:
        assert text.max_abs_diff == 0.0
        assert text.allclose and text.top1_flips == 0
        assert all(layer.bitwise_equal for layer in text.layers)
        assert text.first_divergent_layer is None


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_identical_texts_in_one_batch_give_identical_rows(tiny_path, padding_side):
    texts = ["same words here", "a much longer text that forces padding onto the others", "same words here"]
    result = compare(texts, Settings(model="tiny", dtype="float32", padding_side=padding_side))
    first, _, again = result.texts
    # Whether a GEMM treats two rows of one batch alike is the CPU's kernels' to decide (a tail block may
    # differ): the engine must report exactly what the model's own batched rows give, on this machine.
    oracle = seed_compare(tiny_path, texts, torch.float32, padding_side)
    assert [t.max_abs_diff for t in result.texts] == [o.max_abs_diff for o in oracle]
    rows_equal = torch.equal(oracle[0].batched, oracle[2].batched)
    assert (first.positions == again.positions) == rows_equal
    assert first.token_ids == again.token_ids and first.tokens == again.tokens


@pytest.mark.parametrize("modules", [False, True])
def test_texts_measured_across_chunks_get_the_numbers_of_their_chunk_run_alone(modules):
    """The tiny model's texts of several chunks are measured as one group (their rows fill no metrics block): each
    text gets, digit for digit, what its chunk gives when it is the only one."""
    from dataclasses import asdict

    settings = Settings(model="tiny", dtype="bfloat16", batch_size=3, modules=modules)
    whole = compare(MIXED_TEXTS, settings)
    for start in range(0, len(MIXED_TEXTS), 3):
        alone = compare(MIXED_TEXTS[start : start + 3], settings)
        for ours, theirs in zip(whole.texts[start : start + 3], alone.texts, strict=True):
            assert {**asdict(ours), "index": 0, "line": 0} == {**asdict(theirs), "index": 0, "line": 0}


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_reported_tokens_are_each_texts_own_tokenization(tiny_path, padding_side):
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    result = compare(MIXED_TEXTS, Settings(model="tiny", padding_side=padding_side, batch_size=4))
    for text, source in zip(result.texts, MIXED_TEXTS):
        assert list(text.token_ids) == tokenizer(source)["input_ids"]
        assert [p.token_id for p in text.positions] == list(text.token_ids)
        # Each token as its text, or as its bytes where it is part of a character; together, the text.
        shown = b""
        for token, token_id in zip(text.tokens, text.token_ids):
            if "\ufffd" in tokenizer.decode([token_id]):
                assert re.fullmatch(r"(<0x[0-9A-F]{2}>)+", token), token
                shown += bytes(int(hex_byte, 16) for hex_byte in re.findall(r"<0x(..)>", token))
            else:
                assert token == tokenizer.decode([token_id])
                shown += token.encode()
        assert shown == source.encode()


def test_float64_agrees_far_closer_than_bfloat16():
    settings = Settings(model="tiny", padding_side="left", batch_size=len(MIXED_TEXTS))
    f64 = compare(MIXED_TEXTS, settings.with_changes(dtype="float64"))
    bf16 = compare(MIXED_TEXTS, settings.with_changes(dtype="bfloat16"))
    assert max(t.max_abs_diff for t in f64.texts) < 1e-9
    assert f64.all_close
    # Whether bf16 padded rows diverge at all depends on the CPU's kernels; where they do, it is by far more.
    assert bf16.summary.max_abs_diff == 0 or bf16.summary.max_abs_diff > 1e-3


def test_chunks_pad_only_to_their_own_longest_text():
    # Short texts in a chunk of their own see no padding: their padded rows are their singles exactly
    # (the same shape, so on every CPU), while the text a long one would pad is not.
    texts = ["ab", "cd", "a long text that would pad every other text in its chunk"]
    result = compare(texts, Settings(model="tiny", dtype="bfloat16", batch_size=2, decompose=True, positions="arange"))
    assert [t.decomposition.padding_effect for t in result.texts] == [0.0, 0.0, 0.0]
    mixed = compare(texts, Settings(model="tiny", dtype="bfloat16", batch_size=3, decompose=True, positions="arange"))
    assert [t.decomposition.padding_effect > 0 for t in mixed.texts] == [True, True, False]


def test_progress_reports_each_pass_and_cancel_stops():
    calls = []
    compare(MIXED_TEXTS, Settings(model="tiny", batch_size=4), progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, 8) for i in range(1, 9)] and total_passes(6, 4) == 8
    stages = [running_stage(done, 6, 4) for done in range(9)]
    assert stages == [
        "batched pass 1/2",
        *(f"single passes {k}/6" for k in range(1, 5)),
        "batched pass 2/2",
        "single passes 5/6",
        "single passes 6/6",
        "measuring",
    ]
    # With the padded-row pass too, each text takes two passes after its chunk's batched one.
    assert [running_stage(done, 6, 4, per_text=2) for done in (0, 1, 2, 3, 9, 14)] == [
        "batched pass 1/2",
        "single passes 1/6",
        "single passes 1/6",
        "single passes 2/6",
        "batched pass 2/2",
        "measuring",
    ]
    seen = []
    with pytest.raises(Cancelled):
        compare(
            MIXED_TEXTS, Settings(model="tiny"), progress=lambda d, t: seen.append(d), cancelled=lambda: len(seen) >= 2
        )
    assert seen == [1, 2]


def test_summary_and_config():
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16", positions="arange"))
    summary = result.summary
    assert summary.texts == len(MIXED_TEXTS)
    assert summary.diverged == sum(not t.allclose for t in result.texts)
    assert summary.max_abs_diff == max(t.max_abs_diff for t in result.texts)
    assert summary.top1_flips == sum(sum(p.top1_flip for p in t.positions) for t in result.texts)
    assert result.config["dtype"] == "bfloat16" and result.config["device"] == "cpu"
    layers = [f"model.layers.{i}" for i in range(4)]
    assert [layer.name for layer in result.texts[0].layers] == ["model.embed_tokens", *layers, "model.norm", "logits"]


def test_dtype_auto_is_the_checkpoints():
    assert compare(["hi"], Settings(model="tiny", dtype="auto")).config["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("texts", "settings", "message"),
    [
        (["ok", "  "], Settings(model="tiny"), "text 2 is empty"),
        ([], Settings(model="tiny"), "no texts"),
        (["ok"], Settings(model="tiny", batch_size=0), "batch size must be at least 1"),
        (["ok"], Settings(model="tiny", top_k=0), "top-k must be at least 1"),
        (["ok"], Settings(model="tiny", top_k=10_000), "at most the vocabulary size 512"),
        (["ok"], Settings(model="tiny", atol=-1.0), "atol must be a finite number >= 0"),
    ],
)
def test_bad_input_raises_a_clear_error(texts, settings, message):
    with pytest.raises(InputError, match=message):
        compare(texts, settings)


def test_ordered_topk_breaks_ties_by_token_id():
    import torch

    from batchtui.core.numbers.topk import ordered_topk

    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.5], [5.0, 5.0, 5.0, 5.0, 5.0, 1.0, 9.0]])
    rows = torch.randn(50, 40).to(torch.bfloat16).float()  # bf16 rounding makes many ties
    for spare in (1, 2, 16):  # the tie ends inside the picked ones, runs past them, or all of a row is picked
        values, ids = ordered_topk(x, 4, spare)
        assert ids.tolist() == [[1, 3, 2, 4], [6, 0, 1, 2]]
        assert values.tolist() == [[3.0, 3.0, 2.0, 2.0], [9.0, 5.0, 5.0, 5.0]]
        for row in rows:
            expected = sorted(range(40), key=lambda i: (-row[i].item(), i))[:5]
            assert ordered_topk(row.unsqueeze(0), 5, spare)[1][0].tolist() == expected
            assert ordered_topk(row.bfloat16().unsqueeze(0), 5, spare)[1][0].tolist() == expected  # as metrics call it


@pytest.mark.parametrize("spare", [1, 3, 16])
@pytest.mark.parametrize("vocab", [4096, 5000, 151936])
def test_ordered_topk_over_a_real_vocabulary_is_the_sorted_order(vocab, spare):
    """Over a vocabulary of thousands the top k are picked among the blocks of largest maxima: the same ids as a
    sort by (value descending, id ascending), with bf16 ties, a partial last block, rows of -inf and a NaN, whether
    a tie at the cut is settled among one more than k, three more (the CPU's default) or 16 more (a GPU's)."""
    import torch

    from batchtui.core.numbers.topk import ordered_topk

    torch.manual_seed(0)
    x = (torch.randn(12, vocab) * torch.tensor([3.0, 0.01] * 6)[:, None]).bfloat16().float()
    x[0] = float("-inf")  # every value tied
    x[1, 3:] = float("-inf")  # fewer finite values than k
    x[2, vocab - 1] = 100.0  # the largest in the partial block (or the last full one)
    expected = x.sort(dim=-1, descending=True, stable=True).indices  # a full sort; ties keep the id order
    for k in (1, 5, 20):
        values, ids = ordered_topk(x, k, spare)
        assert torch.equal(ids, expected[:, :k])
        assert torch.equal(values, x.gather(-1, expected[:, :k]))
    x[3, 17] = float("nan")  # the largest for topk and for sort
    assert ordered_topk(x, 5, spare)[1][3].tolist() == x[3].sort(descending=True, stable=True).indices[:5].tolist()
