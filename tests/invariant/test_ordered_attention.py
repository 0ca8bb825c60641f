"""The mode's attention, one query at a time: its output bits depend on its own query and the keys and values it
sees, not on how many other queries share the call, nor on how many keys are hidden from it (padding on either side,
the causal future, a static cache's empty slots; in a window, hidden keys anywhere), nor on the call's thread split;
and it computes attention (close to SDPA's, with soft-capping, sinks, a bias and grouped heads as transformers'
eager attention computes them). Every test runs on both ways: the compiled kernel and the Python path it falls back
to, and the Triton kernel CUDA takes, in Triton's interpreter (where triton is installed)."""

import importlib.util

import pytest
import torch
from helpers.threads import torch_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import scaled_dot_product_attention as sdpa

from batchtui.core.invariant.compiled_kernels import SWITCH, compiled_attention
from batchtui.core.invariant.gpu_kernels import triton_kernels
from batchtui.core.invariant.ordered_attention import ordered_attention

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


WAYS = ["compiled", "python"] + (["triton"] if importlib.util.find_spec("triton") else [])


@pytest.fixture(autouse=True, scope="module", params=WAYS)
def attention_way(request):
    """The module's tests once through the compiled kernel, once through the Python path, once through the Triton
    kernel."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SWITCH, {"compiled": "1", "python": "0", "triton": "triton"}[request.param])
        way = compiled_attention(torch.zeros(1))
        assert (way is not None) == (request.param == "compiled"), "the compiled kernel did not build here"
        if request.param == "triton":
            assert triton_kernels(torch.zeros(1)) is not None, "Triton's interpreter did not run the kernels here"
        yield request.param


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _operands(seen: int, heads: int, kv_heads: int, d: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, 1, d, generator=g).to(dtype)
    k, v = (torch.randn(1, kv_heads, seen, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def _run(threads: int, *args, **kwargs) -> torch.Tensor:
    with torch_threads(threads):
        return ordered_attention(*args, **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    seen=st.integers(1, 70),
    before=st.integers(0, 40),
    after=st.integers(0, 40),
    others=st.integers(0, 20),
    grouped=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 1000),
)
def test_a_query_over_a_prefix_of_its_row_s_keys_gets_the_same_bits_among_others(
    seen, before, after, others, grouped, dtype, threads, seed
):
    """The tiles' way (causal attention, a decoding step): the row's real keys after `before` padded ones and before
    `after` empty slots, beside other queries that each see a prefix of them (a prefill's, a trainer's), and a second
    row of its own padding in the batch."""
    heads, kv_heads, d = (4, 2, 24) if grouped else (3, 3, 16)
    q, k, v = _operands(seen, heads, kv_heads, d, dtype, seed)
    alone = _run(threads, q, k, v, torch.ones((), dtype=torch.bool), 0.3)
    g = torch.Generator().manual_seed(seed + 1)
    total = before + seen + after
    big_k, big_v = (torch.randn(2, kv_heads, total, d, generator=g).to(dtype) for _ in range(2))
    big_k[0, :, before : before + seen], big_v[0, :, before : before + seen] = k[0], v[0]
    queries = torch.cat([torch.randn(2, heads, others, d, generator=g).to(dtype), q.expand(2, -1, -1, -1)], dim=2)
    attend = torch.zeros(2, 1, others + 1, total, dtype=torch.bool)
    for row, start in enumerate((before, after)):  # the second row: its keys after `after` padded ones
        for i in range(others + 1):
            visible = seen if i == others else int(torch.randint(1, seen + 1, (1,), generator=g))
            attend[row, 0, i, start : start + visible] = True
    among = _run(threads, queries, big_k, big_v, attend, 0.3)
    assert torch.equal(among[:1, :, -1:], alone)


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(1, 70),
    packed=st.integers(1, 40),
    after=st.integers(0, 20),
    grouped=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 1000),
)
def test_a_sequence_packed_between_others_in_one_row_gets_the_bits_it_gets_alone(
    length, packed, after, grouped, dtype, threads, seed
):
    """A trainer's packed row (verl's and OpenRLHF's layout): a sequence of `length` tokens behind one of `packed`
    and before one of `after`, each attending causally to its own tokens only, so its queries see a span of keys
    that starts past the row's first key; in the batch's second row the same sequence after `after` padded places
    (queries that see nothing) and before one of `packed`."""
    heads, kv_heads, d = (4, 2, 24) if grouped else (3, 3, 16)
    g = torch.Generator().manual_seed(seed)
    total = packed + length + after
    q = torch.randn(2, heads, total, d, generator=g).to(dtype)
    k, v = (torch.randn(2, kv_heads, total, d, generator=g).to(dtype) for _ in range(2))
    own, second = slice(packed, packed + length), slice(after, after + length)
    for t in (q, k, v):
        t[1, :, second] = t[0, :, own]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    alone = _run(threads, q[:1, :, own], k[:1, :, own], v[:1, :, own], causal, 0.3)
    attend = torch.zeros(2, 1, total, total, dtype=torch.bool)
    for row, sequences in enumerate([(0, packed, packed + length), (after, after + length)]):
        for start, end in zip(sequences, sequences[1:] + (total,)):
            attend[row, 0, start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
    among = _run(threads, q, k, v, attend, 0.3)
    assert torch.equal(among[:1, :, own], alone), "packed between others"
    assert torch.equal(among[1:, :, second], alone), "after padding, packed before another"


@settings(max_examples=40, deadline=None)
@given(
    seen=st.integers(1, 70),
    before=st.integers(0, 40),
    holes=st.integers(0, 5),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_in_a_window_a_query_s_bits_do_not_depend_on_where_its_keys_sit(seen, before, holes, dtype, seed):
    """The scan's way (a sliding window, a mask with holes): hidden keys before and between the ones it sees."""
    q, k, v = _operands(seen, 4, 2, 24, dtype, seed)
    alone = ordered_attention(q, k, v, torch.ones((), dtype=torch.bool), 0.3, windowed=True)
    g = torch.Generator().manual_seed(seed + 1)
    cut = seen // 2
    junk_k, junk_v = (torch.randn(1, 2, before + holes, 24, generator=g).to(dtype) for _ in range(2))
    big_k, big_v = (
        torch.cat([junk[:, :, :before], t[:, :, :cut], junk[:, :, before:], t[:, :, cut:]], dim=2)
        for junk, t in ((junk_k, k), (junk_v, v))
    )
    visible = torch.zeros(big_k.shape[2], dtype=torch.bool)
    visible[before : before + cut] = True
    visible[before + cut + holes :] = True
    among = ordered_attention(q, big_k, big_v, visible, 0.3, windowed=True)
    assert torch.equal(among, alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_it_computes_attention(dtype):
    """Against SDPA (causal, a bool mask with holes, grouped heads, a float bias) and against eager attention's
    soft-capping and sinks written out here."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 9, 16, dtype=dtype)
    k, v = torch.randn(2, 2, 9, 16, dtype=dtype), torch.randn(2, 2, 9, 16, dtype=dtype)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    close = {"rtol": 1e-5, "atol": 1e-6}
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(ordered_attention(q, k, v, causal, 0.25), sdpa(q, kr, vr, is_causal=True, scale=0.25),
                               **close)  # fmt: skip
    holes = (torch.rand(2, 1, 9, 9) > 0.4) | torch.eye(9, dtype=torch.bool)
    torch.testing.assert_close(ordered_attention(q, k, v, holes, 0.25), sdpa(q, kr, vr, attn_mask=holes, scale=0.25),
                               **close)  # fmt: skip
    bias = torch.randn(2, 4, 9, 9, dtype=dtype)
    ours = ordered_attention(q, k, v, torch.ones((), dtype=torch.bool), 0.25, bias=bias)
    torch.testing.assert_close(ours, sdpa(q, kr, vr, attn_mask=bias, scale=0.25), **close)
    scores = q @ kr.transpose(-1, -2) * 0.25
    capped = (torch.tanh(scores / 5.0) * 5.0).masked_fill(~causal, float("-inf"))
    torch.testing.assert_close(ordered_attention(q, k, v, causal, 0.25, softcap=5.0), capped.softmax(-1) @ vr, **close)
    sinks = torch.randn(4, dtype=dtype)
    logits = torch.cat([scores.masked_fill(~causal, float("-inf")), sinks.reshape(1, 4, 1, 1).expand(2, 4, 9, 1)], -1)
    expected = logits.softmax(-1)[..., :-1] @ vr
    torch.testing.assert_close(ordered_attention(q, k, v, causal, 0.25, sinks=sinks), expected, **close)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_against_float64_it_is_no_less_accurate_than_the_library(dtype):
    """The same inputs in `dtype` through the mode's attention and through SDPA, each against SDPA in float64 on them:
    the mode's error no larger (a tenth for the two kernels' own roundings of a mean, a quarter of a maximum)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, n, 40, 64).to(dtype) for n in (4, 2, 2))
    causal = torch.ones(40, 40, dtype=torch.bool).tril()

    def error(out: torch.Tensor) -> tuple[float, float]:
        wide = (t.double().repeat_interleave(h, 1) for t, h in ((q, 1), (k, 2), (v, 2)))
        gap = (out.double() - sdpa(*wide, attn_mask=causal)).abs()
        return gap.mean().item(), gap.max().item()

    ours = error(ordered_attention(q, k, v, causal, 64**-0.5))
    library = error(sdpa(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=causal))
    assert ours[0] <= 1.1 * library[0] and ours[1] <= 1.25 * library[1], (ours, library)


def test_a_query_that_sees_nothing_gets_zeros():
    q, k, v = _operands(5, 2, 2, 8, torch.float32, 0)
    out = ordered_attention(q, k, v, torch.zeros(1, 1, 1, 5, dtype=torch.bool), 0.3)
    assert torch.equal(out, torch.zeros_like(out))


def test_under_autograd_the_forward_is_the_same_bits_and_the_backward_is_attention_s():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.no_grad():
        plain = ordered_attention(q, k, v, causal, 0.3)
    out = ordered_attention(q, k, v, causal, 0.3)
    assert out.requires_grad and torch.equal(out.detach(), plain)
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    sdpa(q, k, v, is_causal=True, scale=0.3).square().sum().backward()
    for ours, theirs in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
