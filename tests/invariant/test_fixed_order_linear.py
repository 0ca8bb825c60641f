"""The mode's compiled linear kernel (`compiled/fixed_order_linear.cpp`, float32 and bfloat16): a row's bits do not
depend on the call's height, the row's place in it or the thread count (by construction: nothing is measured); it
computes the product (no less accurate against float64 than the GEMM library's); and in the mode a small model's
layers take it, reading the weight as it is at every call (an optimizer's step, a change through `.data`)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from batchtui.core.invariant.compiled_kernels import compiled_linear
from batchtui.core.invariant.mode import batch_invariant
from batchtui.core.invariant.rows import chosen_paths
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

NO_BIAS = torch.empty(0)
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def op():
    way = compiled_linear(torch.zeros(1))
    assert way is not None, "the compiled kernels did not build here"
    return way


def _linear(op, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, threads: int) -> torch.Tensor:
    """The kernel's call on `threads` threads (it takes the count as its argument)."""
    return op(x, weight, NO_BIAS if bias is None else bias, threads, x.new_empty(x.shape[0], weight.shape[0]))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 90),
    k=st.integers(1, 300),
    n=st.integers(1, 80),
    start=st.integers(0, 89),
    count=st.integers(1, 20),
    with_bias=st.booleans(),
    threads=st.sampled_from([1, 2]),
    strided=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_a_row_gets_the_same_bits_in_a_call_of_any_height_and_place(
    op, rows, k, n, start, count, with_bias, threads, strided, dtype, seed
):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, k + 3, generator=g).to(dtype)
    # rows of another stride (an odd offset: a bfloat16 pair of terms read across a word), elements contiguous
    x = wide[:, 1 : k + 1] if strided else wide[:, :k].contiguous()
    weight = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    whole = _linear(op, x, weight, bias, threads)
    start = min(start, rows - 1)
    part = x[start : start + count]
    assert torch.equal(_linear(op, part, weight, bias, 3 - threads), whole[start : start + count])
    assert torch.equal(_linear(op, x[start : start + 1], weight, bias, 1), whole[start : start + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(352, 128), (128, 352), (704, 256), (4096, 256), (64, 1000), (33, 7)])
def test_it_computes_the_product_no_less_accurately_than_the_library(op, n, k, dtype):
    g = torch.Generator().manual_seed(n * k)
    x, weight = torch.randn(50, k, generator=g).to(dtype), (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    exact = F.linear(x.double(), weight.double(), bias.double())
    ours = (_linear(op, x, weight, bias, 2).double() - exact).abs().mean()
    library = (F.linear(x, weight, bias).double() - exact).abs().mean()
    assert ours <= 1.1 * library, (ours, library)
    close = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(_linear(op, x, weight, None, 2), F.linear(x, weight), **close)


def test_an_empty_call_and_bad_operands(op):
    weight = torch.randn(5, 4)
    assert _linear(op, torch.randn(0, 4), weight, None, 2).shape == (0, 5)
    with pytest.raises(RuntimeError, match="float32"):
        _linear(op, torch.randn(2, 4, dtype=torch.float64), weight, None, 1)
    with pytest.raises(RuntimeError, match="float32"):  # two dtypes
        _linear(op, torch.randn(2, 4, dtype=torch.bfloat16), weight, None, 1)
    with pytest.raises(RuntimeError, match="weight"):
        _linear(op, torch.randn(2, 3), weight, None, 1)


@pytest.fixture(scope="module", params=DTYPES)
def english(request):
    return AutoModelForCausalLM.from_pretrained(builtin_path("qwen2-english-4m"), dtype=request.param).eval()


def test_in_the_mode_a_small_model_s_layers_take_it_and_read_the_weight_as_it_is(english, op):
    ids = torch.tensor([[5, 17, 300, 41, 9, 77]])
    layer = english.model.layers[0].mlp.down_proj
    with torch.no_grad(), batch_invariant(english):
        first = english(input_ids=ids).logits
        taken = {c.path for c in chosen_paths() if c.key[0][0] == "linear" and c.key[1] == english.dtype}
        assert taken == {"compiled"}, taken
        kept = layer.weight.detach().clone()
        try:
            layer.weight.data.mul_(1.5)  # not seen by the parameter's version counter
            changed = english(input_ids=ids).logits
        finally:
            layer.weight.data.copy_(kept)
        again = english(input_ids=ids).logits
    assert not torch.equal(first, changed)
    assert torch.equal(first, again)
    # the changed weight's logits are the product's (close to the library's on the changed weight)
    with torch.no_grad():
        layer.weight.data.mul_(1.5)
        try:
            plain = english(input_ids=ids).logits
        finally:
            layer.weight.data.copy_(kept)
    close = 1e-4 if english.dtype == torch.float32 else 0.1
    torch.testing.assert_close(changed.float(), plain.float(), rtol=close, atol=close)
