"""The mode's Triton kernels (what CUDA takes), run here by Triton's interpreter: a row's product and a query's
attention keep their bits at any height and place, in any layout the mode meets (a prefill, a decoding step, a
left-padded batch, a packed row), no less accurate against float64 than the library; the mode's forward through them
gives a text the same logits decoded and alone as in a batch; where Triton cannot run, the Python paths, in one
line."""

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtui.core import batch_invariant
from batchtui.core.invariant import gpu_kernels
from batchtui.core.invariant.compiled_kernels import SWITCH
from batchtui.core.invariant.measuring import measuring_reported
from batchtui.core.invariant.ordered_attention import _plain
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def kernels():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SWITCH, "triton")
        found = gpu_kernels.triton_kernels(torch.zeros(1))
        assert found is not None, "Triton's interpreter did not run the kernels here"
        yield found


@settings(max_examples=25, deadline=None)
@given(
    height=st.integers(1, 150),
    place=st.integers(0, 149),
    k=st.integers(1, 100),
    n=st.integers(1, 90),
    bias=st.booleans(),
    transposed=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_a_row_s_product_has_its_bits_at_any_height_and_place(kernels, height, place, k, n, bias, transposed, dtype,
                                                               seed):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(height, k, generator=g).to(dtype)
    weight = torch.randn(n, k, generator=g).to(dtype)
    operand = weight.t() if transposed else weight.t().contiguous()  # a layer's weight as stored, or copied
    added = torch.randn(n, generator=g).to(dtype) if bias else None
    place %= height
    full = kernels.fixed_order_matmul(rows, operand, added)
    alone = kernels.fixed_order_matmul(rows[place : place + 1], operand, added)
    assert torch.equal(full[place : place + 1], alone)
    batched = kernels.fixed_order_matmul(torch.stack([rows, rows.flip(0)]), operand.expand(2, k, n))
    assert torch.equal(batched[0], kernels.fixed_order_matmul(rows, operand))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_product_is_no_less_accurate_than_the_library(kernels, dtype):
    """Against float64 on the same operands, the mean error at most the library's (`F.linear`), a tenth for its own
    roundings."""
    g = torch.Generator().manual_seed(0)
    rows, weight, bias = torch.randn(70, 200, generator=g), torch.randn(90, 200, generator=g), torch.randn(90)
    rows, weight, bias = rows.to(dtype), weight.to(dtype), bias.to(dtype)
    exact = rows.double() @ weight.double().t() + bias.double()
    ours = (kernels.fixed_order_matmul(rows, weight.t(), bias).double() - exact).abs().mean()
    library = (torch.nn.functional.linear(rows, weight, bias).double() - exact).abs().mean()
    assert ours <= library * 1.1


def _attention(kernels, q, k, v, attend, **kwargs):
    """The kernel on a bool mask [b, 1, q, kv] whose every query sees one span of keys."""
    counts = attend.sum(-1).expand(q.shape[0], q.shape[1], q.shape[2])
    first = attend[:, 0].to(torch.uint8).argmax(-1).expand(q.shape[0], q.shape[2])
    return kernels.ordered_attention_gpu(q, k, v, kernels.query_tiles(first), counts, 0.3, kwargs.get("bias"),
                                         kwargs.get("softcap"), kwargs.get("sinks"))  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 50),
    before=st.integers(0, 40),
    packed=st.integers(0, 40),
    grouped=st.booleans(),
    extras=st.sampled_from(["none", "softcap", "sinks", "bias"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_a_query_s_attention_is_the_same_alone_decoded_padded_and_packed(kernels, length, before, packed, grouped,
                                                                         extras, dtype, seed):  # fmt: skip
    """A text of `length` tokens: its causal attention alone; its last query as a decoding step over the cache; the
    text left-padded by `before` in a batch; the text packed behind another sequence of `packed` tokens."""
    heads, kv_heads, d = (4, 2, 40) if grouped else (2, 2, 16)
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    q, k, v = randn(1, heads, length, d), randn(1, kv_heads, length, d), randn(1, kv_heads, length, d)
    extra = {"softcap": {"softcap": 4.0}, "sinks": {"sinks": torch.randn(heads, generator=g)}}.get(extras, {})
    bias_of = (lambda n: torch.randn(1, heads, n, n, generator=g)) if extras == "bias" else None
    causal = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
    bias = bias_of(length) if bias_of else None
    alone = _attention(kernels, q, k, v, causal, bias=bias, **extra)

    step_bias = None if bias is None else bias[:, :, -1:]
    step = _attention(kernels, q[:, :, -1:], k, v, causal[:, :, -1:], bias=step_bias, **extra)
    assert torch.equal(step, alone[:, :, -1:]), "a decoding step over the cache"

    total = before + length
    padded = [torch.cat([randn(1, t.shape[1], before, d), t], 2) for t in (q, k, v)]
    mask = torch.zeros(1, 1, total, total, dtype=torch.bool)
    mask[..., before:, before:] = causal
    padded_bias = None
    if bias is not None:
        padded_bias = torch.zeros(1, heads, total, total)
        padded_bias[..., before:, before:] = bias
    rows = [torch.cat([t, torch.cat([randn(1, t.shape[1], total, d)], 0)], 0) for t in padded]  # a second row
    masks = torch.cat([mask, torch.ones(total, total, dtype=torch.bool).tril()[None, None]], 0)
    biases = None if padded_bias is None else padded_bias.expand(2, -1, -1, -1)
    in_batch = _attention(kernels, *rows, masks, bias=biases, **extra)
    assert torch.equal(in_batch[:1, :, before:], alone), "left-padded in a batch"

    if packed:
        other = [randn(1, t.shape[1], packed, d) for t in (q, k, v)]
        row = [torch.cat([o, t], 2) for o, t in zip(other, (q, k, v))]
        both = torch.zeros(1, 1, packed + length, packed + length, dtype=torch.bool)
        both[..., :packed, :packed] = torch.ones(packed, packed, dtype=torch.bool).tril()
        both[..., packed:, packed:] = causal
        row_bias = None
        if bias is not None:
            row_bias = torch.zeros(1, heads, packed + length, packed + length)
            row_bias[..., packed:, packed:] = bias
        in_row = _attention(kernels, *row, both, bias=row_bias, **extra)
        assert torch.equal(in_row[:, :, packed:], alone), "packed behind another sequence"


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_is_no_less_accurate_than_the_library(kernels, dtype):
    """Against float64, the mean error at most SDPA's on the same inputs (a tenth for its own roundings)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 48, 64, generator=g).to(dtype) for n in (4, 2, 2))
    causal = torch.ones(48, 48, dtype=torch.bool).tril()[None, None]
    exact = _plain(q.double(), k.double(), v.double(), causal, 0.3, None, None, None)
    ours = (_attention(kernels, q, k, v, causal).double() - exact).abs().mean()
    library = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    )
    assert ours <= (library.double() - exact).abs().mean() * 1.1


@pytest.mark.slow
def test_the_mode_through_them_gives_a_text_its_logits_decoded_and_in_a_batch(kernels):
    """The tiny built-in in the mode with every product and attention through the Triton kernels: each greedy step of
    a left-padded batch is the bits of one forward of the text alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = builtin_path("tiny")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    texts = ["a", "The quick brown fox jumps"]
    with batch_invariant(model), torch.no_grad():
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)  # fmt: skip
        steps = torch.stack(out.logits, 1)  # [b, new, vocab]
        for i, text in enumerate(texts):
            padding = int((batch.attention_mask[i] == 0).sum())
            whole = model(out.sequences[i][None, padding:-1]).logits[0]
            prompt = batch.input_ids.shape[1] - padding
            assert torch.equal(steps[i], whole[prompt - 1 :]), text


def test_where_triton_cannot_run_the_python_paths_are_taken_in_one_line(monkeypatch):
    monkeypatch.setattr(gpu_kernels, "_checked", {})
    monkeypatch.setattr(gpu_kernels.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(SWITCH, "triton")
    heard = []
    with measuring_reported(heard.append):
        assert gpu_kernels.triton_kernels(torch.zeros(1)) is None
        assert gpu_kernels.triton_kernels(torch.zeros(1)) is None  # decided once
    assert [event.notice for event in heard] == [
        "the mode's Triton kernels are not taken here (Triton is not installed): their Python paths are (the same "
        "bits in every arrival, slower)"
    ]


def test_on_a_cpu_they_are_taken_only_when_asked_for(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    assert gpu_kernels.triton_kernels(torch.zeros(1)) is None
    monkeypatch.setenv(SWITCH, "triton")
    assert gpu_kernels.triton_kernels(torch.zeros(1, dtype=torch.float64)) is None  # (float64: the Python paths)
