"""Calls that do not cross from aten's dispatcher into Python in the mode. The census: the CPU kernels a model's
passes never need replaced are left to the library, and only those (a call a batch can change keeps its kernel). And
a model's activation modules compute tail-free in their own forward."""

import contextlib
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import MIXED_TEXTS
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.activations import GELUActivation, GELUTanh

from batchtui.core import batch_invariant
from batchtui.core.invariant.census import needless_cpu_kernels
from batchtui.core.invariant.elementwise import TailFreeActivations, TailFreeElementwise
from batchtui.core.invariant.linear import RowInvariantLinears
from batchtui.core.invariant.matmul import RowInvariantMatmuls
from batchtui.core.invariant.mode import coverage_gap, library_kernels_on_cpu
from batchtui.core.invariant.reduction import RowInvariantReductions
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

# A Qwen2 norm: a float32 mean over the hidden size and an rsqrt of it; transformers' mask code sums a boolean mask.
LEFT_TO_THE_LIBRARY = {"mean.dim", "rsqrt", "sum.dim_IntList"}
# In the mode, besides: the products and the activation, made only inside the linear layers and the activation
# modules, which the mode computes at the module
LEFT_IN_THE_MODE = LEFT_TO_THE_LIBRARY | {"mm", "addmm", "silu"}


def _tiny(dtype=torch.float32):
    path = builtin_path("tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), tokenizer


def _scopes():
    return [TailFreeElementwise(), RowInvariantReductions()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_norm_s_mean_and_float32_rsqrt_keep_the_library_s_kernels_and_rows_stay_bitwise(dtype):
    model, tokenizer = _tiny(dtype)
    assert library_kernels_on_cpu(model) == LEFT_IN_THE_MODE
    saved = torch.get_num_threads()
    torch.set_num_threads(2)  # two threads split a call's elements (and a long row) between them
    try:
        with torch.inference_mode(), batch_invariant(model):
            elementwise, reductions = TailFreeElementwise.registered(), RowInvariantReductions.registered()
            matmuls = RowInvariantMatmuls.registered()
            tokenizer.padding_side = "left"
            batch = tokenizer(MIXED_TEXTS, return_tensors="pt", padding=True)
            positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # the seed's
            logits = model(**batch, position_ids=positions).logits
            singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in MIXED_TEXTS]
    finally:
        torch.set_num_threads(saved)
    assert ("sin", "CPU") in elementwise and not {("silu", "CPU"), ("rsqrt", "CPU")} & elementwise
    # The layers' products are computed at the layer: the CPU's mm and addmm stay the library's, CUDA's not.
    assert {("mm", "CUDA"), ("addmm", "CUDA")} <= matmuls and not {("mm", "CPU"), ("addmm", "CPU")} & matmuls
    # The vector norm, never called, keeps its kernel; CUDA's reduction kernels still lay out threads by rows.
    assert {op for op, key in reductions if key == "CPU"} == {"linalg_vector_norm"}
    assert ("mean.dim", "CUDA") in reductions
    assert TailFreeElementwise.registered() == RowInvariantReductions.registered() == frozenset()
    for i, single in enumerate(singles):
        assert torch.equal(logits[i][batch.attention_mask[i].bool()], single), MIXED_TEXTS[i]


def _with_call(model, call):
    """The model with `call(hidden states)` made (its result dropped) before its final norm in every pass."""

    def before_the_norm(module, args):
        call(args[0])

    return model.model.norm.register_forward_pre_hook(before_the_norm)


@pytest.mark.parametrize(
    "op, call",
    [
        ("mean.dim", lambda h: h.transpose(1, 2).mean(-1)),  # a row as long as the text
        ("sum.dim_IntList", lambda h: h.new_ones(2, 40000).sum(-1)),  # a row past the parallel grain
        ("rsqrt", lambda h: torch.rsqrt(h.abs().bfloat16() + 1)),  # bf16's scalar tail rounds otherwise
    ],
)
def test_a_call_a_batch_can_change_keeps_its_kernel(op, call):
    model, _ = _tiny()
    assert op in needless_cpu_kernels(model, _scopes())
    handle = _with_call(model, call)
    try:
        assert needless_cpu_kernels(model, _scopes()) == LEFT_TO_THE_LIBRARY - {op}
    finally:
        handle.remove()


def test_an_op_the_model_never_calls_keeps_its_kernel():
    model, _ = _tiny()
    left = needless_cpu_kernels(model, _scopes())
    assert "gelu" not in left and "linalg_vector_norm" not in left  # not seen: not known to need nothing
    handle = _with_call(model, lambda h: torch.linalg.vector_norm(h, dim=-1))
    try:
        assert needless_cpu_kernels(model, _scopes()) == LEFT_TO_THE_LIBRARY | {"linalg_vector_norm"}
    finally:
        handle.remove()


def _census_in_the_mode(model):
    scopes = [RowInvariantMatmuls(), TailFreeElementwise(), RowInvariantReductions()]
    return needless_cpu_kernels(model, scopes, [RowInvariantLinears(model), TailFreeActivations(model)])


@pytest.mark.parametrize(
    "op, call",
    [
        ("mm", lambda h: torch.mm(h[0], h[0].T)),  # a product outside the linear layers: a sum over the hidden size
        ("bmm", lambda h: h @ h.transpose(1, 2)),
    ],
)
def test_a_product_outside_the_linear_layers_keeps_its_kernel_one_of_one_term_does_not(op, call):
    model, _ = _tiny()
    assert _census_in_the_mode(model) == LEFT_IN_THE_MODE  # bmm: never called
    handle = _with_call(model, call)
    try:
        assert op not in _census_in_the_mode(model)
    finally:
        handle.remove()
    handle = _with_call(model, lambda h: call(h[..., :1]))  # over one term: one rounded product per element
    try:
        assert op in _census_in_the_mode(model)
    finally:
        handle.remove()


def test_a_product_a_layer_makes_outside_the_mode_s_forward_keeps_its_kernel(checkpoints):
    """A GPT-2 `Conv1D` is not an `nn.Linear`: its addmm is the aten kernel's in the mode, and keeps it; its head,
    a linear layer, leaves mm to the library."""
    model = AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"], dtype=torch.float32).eval()
    left = library_kernels_on_cpu(model)
    assert "addmm" not in left and "mm" in left


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_s_rows_are_the_same_whether_another_entry_holds_the_cpu_s_matmul_kernels_or_not(dtype):
    """Left to the library, a layer's product is the op itself (allocated in C++); where another entry registers the
    CPU kernels meanwhile, the out= form, or (past the look) the mode's kernel, which takes the layer's path: the
    same bits in every case, alone and batched."""
    model, tokenizer = _tiny(dtype)
    tokenizer.padding_side = "left"
    batch = tokenizer(MIXED_TEXTS, return_tensors="pt", padding=True)
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    results = []
    with torch.inference_mode(), batch_invariant(model):
        for holding in (contextlib.nullcontext(), RowInvariantMatmuls()):
            with holding:
                assert (("mm", "CPU") in RowInvariantMatmuls.registered()) == isinstance(holding, RowInvariantMatmuls)
                logits = model(**batch, position_ids=positions).logits
                singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in MIXED_TEXTS]
                results.append((logits, singles))
    (logits, singles), (held_logits, held_singles) = results
    assert torch.equal(logits, held_logits)
    for i, single in enumerate(singles):
        assert torch.equal(single, held_singles[i])
        assert torch.equal(logits[i][batch.attention_mask[i].bool()], single), MIXED_TEXTS[i]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_f_linear_is_the_library_s_product_on_the_flattened_rows(dtype):
    """What a layer's call of rows the library takes whole leans on: `F.linear` on a contiguous input of two or more
    dims is addmm (with a bias) or mm (without) on its rows flattened, bit for bit."""
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32).to(dtype), torch.randn(48).to(dtype)
    for shape in ((37, 32), (3, 37, 32), (2, 3, 7, 32)):
        x = torch.randn(shape).to(dtype)
        rows = x.reshape(-1, 32)
        assert torch.equal(F.linear(x, weight), torch.mm(rows, weight.t()).view(*shape[:-1], 48)), shape
        assert torch.equal(F.linear(x, weight, bias), torch.addmm(bias, rows, weight.t()).view(*shape[:-1], 48)), shape


@pytest.mark.slow
def test_a_layer_s_forward_is_kept_from_one_entry_to_the_next_until_the_model_is_cast():
    model, tokenizer = _tiny()
    layer = model.lm_head
    with batch_invariant(model):
        first = layer.forward
    with batch_invariant(model):
        assert layer.forward is first  # its paths chosen once
    model.to(torch.bfloat16)
    tokenizer.padding_side = "left"
    batch = tokenizer(MIXED_TEXTS[:3], return_tensors="pt", padding=True)
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode(), batch_invariant(model):
        assert layer.forward is not first
        logits = model(**batch, position_ids=positions).logits
        singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in MIXED_TEXTS[:3]]
    assert logits.dtype == torch.bfloat16
    for i, single in enumerate(singles):
        assert torch.equal(logits[i][batch.attention_mask[i].bool()], single)
    gone = weakref.ref(layer)
    del model, layer, first
    gc.collect()
    assert gone() is None  # kept forwards do not keep a model alive


def _old_weight_norm(layer) -> torch.Tensor:
    torch.nn.utils.weight_norm(layer)
    return layer.weight_g


def _parametrized_weight_norm(layer) -> torch.Tensor:
    torch.nn.utils.parametrizations.weight_norm(layer)
    return layer.parametrizations.weight.original0


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize("weight_norm", [_old_weight_norm, _parametrized_weight_norm])
def test_a_layer_whose_weight_is_computed_before_each_call_is_read_at_the_call(weight_norm):
    """`weight_norm` computes a layer's weight anew before every call (a hook, or a parametrization): the mode reads
    it there, not the last pass's (a step of training between two passes changed it), and rows stay bitwise."""
    model, tokenizer = _tiny()
    layer = model.model.layers[0].mlp.down_proj
    magnitude = weight_norm(layer)
    ids = tokenizer(MIXED_TEXTS[0], return_tensors="pt").input_ids
    with torch.inference_mode(), batch_invariant(model):
        model(input_ids=ids)
    with torch.no_grad():
        magnitude.mul_(2.0)
    tokenizer.padding_side = "left"
    batch = tokenizer(MIXED_TEXTS[:3], return_tensors="pt", padding=True)
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        with batch_invariant(model):
            assert "forward" not in vars(layer)  # the layer's own forward, its products the mode's kernels
            logits = model(**batch, position_ids=positions).logits
            singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in MIXED_TEXTS[:3]]
        outside = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in MIXED_TEXTS[:3]]
    for i, (single, own) in enumerate(zip(singles, outside)):
        assert torch.equal(logits[i][batch.attention_mask[i].bool()], single)
        assert torch.allclose(single, own, atol=1e-4), (single - own).abs().max()  # today's weight, not the last's


class _PlainSilu(torch.nn.Module):
    """An activation the mode does not compute at the module: its `F.silu` reaches aten's kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def _weight_norm_down_proj(mlp) -> None:
    _old_weight_norm(mlp.down_proj)  # its product now aten's mm, at every call (no bias)


def _plain_activation(mlp) -> None:
    mlp.act_fn = _PlainSilu()


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
@pytest.mark.parametrize(("change", "op"), [(_weight_norm_down_proj, "mm"), (_plain_activation, "silu")])
def test_a_model_changed_after_its_first_entry_is_probed_again_and_its_rows_stay_bitwise(change, op):
    """At the first entry the census left `op`'s kernel to the library: the model called it only inside the layers
    the mode computes itself. Changed since, the model calls it elsewhere (a weight-normed layer's own product, a plain
    activation module): the next entry finds it again, the kernel is the mode's, and short texts (fewer rows than
    the GEMM library keeps rows from) stay bitwise, prefill and every decoding step."""
    model, tokenizer = _tiny()
    with torch.inference_mode(), batch_invariant(model):
        model(input_ids=tokenizer(MIXED_TEXTS[0], return_tensors="pt").input_ids)
    assert op in library_kernels_on_cpu(model)
    for layer in model.model.layers:
        change(layer.mlp)
    assert op not in library_kernels_on_cpu(model)
    texts = ["ab", "hello there", "x"]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    greedy = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "output_logits": True}
    with torch.inference_mode(), batch_invariant(model):
        positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        rows = model(**batch, position_ids=positions).logits
        steps = torch.stack(model.generate(**batch, **greedy, return_dict_in_generate=True).logits, dim=1)
        for i, text in enumerate(texts):
            alone = tokenizer(text, return_tensors="pt")
            assert torch.equal(rows[i][batch.attention_mask[i].bool()], model(**alone).logits[0]), text
            alone_steps = torch.stack(model.generate(**alone, **greedy, return_dict_in_generate=True).logits, dim=1)
            assert torch.equal(steps[i], alone_steps[0]), text


def test_a_model_whose_logits_hold_nan_is_not_taken_for_one_mixing_tokens():
    """The probe for other token mixers compares the last position's logits for two first tokens: NaN (a vocabulary
    entry whose weights are, here set by hand) is the same result twice, not a change."""
    model, tokenizer = _tiny()
    with torch.no_grad():
        model.lm_head.weight[7] = float("nan")  # (tied: the probe's ids never read it)
    ids = tokenizer(MIXED_TEXTS[0], return_tensors="pt").input_ids
    with torch.inference_mode(), batch_invariant(model):
        logits = model(input_ids=ids).logits
    assert logits[..., 7].isnan().all() and not logits[..., :7].isnan().any()
    assert coverage_gap(model) is None


def test_entries_wanting_other_kernels_share_registrations_and_the_last_exit_undoes_each():
    dumps = {op: torch._C._dispatch_dump(f"aten::{op}") for op in ("rsqrt", "silu")}
    x = torch.randn(7, 100).abs() + 0.1
    with TailFreeElementwise(frozenset({"rsqrt"})):
        assert TailFreeElementwise.registered() >= {("silu", "CPU")}
        assert ("rsqrt", "CPU") not in TailFreeElementwise.registered()
        assert torch._C._dispatch_dump("aten::rsqrt") == dumps["rsqrt"]
        with TailFreeElementwise():
            assert ("rsqrt", "CPU") in TailFreeElementwise.registered()
            inner = torch.rsqrt(x), torch.nn.functional.silu(x)
        assert ("rsqrt", "CPU") not in TailFreeElementwise.registered()
        assert torch._C._dispatch_dump("aten::rsqrt") == dumps["rsqrt"]
        assert torch.equal(torch.nn.functional.silu(x), inner[1]) and torch.equal(torch.rsqrt(x), inner[0])
    assert TailFreeElementwise.registered() == frozenset()
    assert {op: torch._C._dispatch_dump(f"aten::{op}") for op in dumps} == dumps


@contextlib.contextmanager
def _passes(model):
    """The model's forward passes made inside the block, as a list that grows while it lasts."""
    passes = []
    handle = model.register_forward_pre_hook(lambda module, args: passes.append(module))
    try:
        yield passes
    finally:
        handle.remove()


def test_the_probe_and_census_run_once_per_model_nested_entries_too():
    model, _ = _tiny()
    with _passes(model) as passes:
        with batch_invariant(model):
            first = len(passes)
        with batch_invariant(model), batch_invariant(model):  # the inner one finds the model routed to the mode
            pass
        with batch_invariant(model):
            pass
    assert first > 0 and len(passes) == first


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_library_s_own_reductions_keep_rows_shorter_than_the_grain_in_any_call(dtype):
    """What the census leaves a norm's mean to: without the mode, on two threads, a row of 1536 is reduced to the
    same bits alone and in calls of up to 100 rows (153,600 elements, past the grain: split by rows)."""
    torch.manual_seed(0)
    a = torch.randn(100, 1536).to(dtype)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for reduce in (lambda x: x.mean(-1, keepdim=True), lambda x: x.sum(-1), lambda x: x.norm(dim=-1)):
            alone = torch.cat([reduce(a[i : i + 1]) for i in range(len(a))])
            for height in (2, 3, 17, 64, 100):
                assert torch.equal(reduce(a[:height]), alone[:height]), (reduce, height)
    finally:
        torch.set_num_threads(saved)


def test_activation_modules_compute_tail_free_in_their_own_forward_in_the_mode_and_only_there(monkeypatch):
    """In the mode the MLP's activation computes what silu's replaced kernel computes, at the module (through the
    op's out= form): the kernel is not reached from it, an element gets the same bits alone and among others, and
    an in-place module keeps its own forward."""
    model, tokenizer = _tiny(torch.bfloat16)  # bf16's vector step (64) leaves tails in silu's 352 wide rows
    activation = next(m for m in model.modules() if type(m).__name__ == "SiLUActivation")
    with batch_invariant(model):  # the probe and the census, before the kernels are counted
        pass
    reached = []
    kernels = TailFreeElementwise.kernels

    def counted(self):
        return {
            key: lambda *a, fn=fn, key=key, **k: reached.append(key) or fn(*a, **k) for key, fn in kernels(self).items()
        }

    monkeypatch.setattr(TailFreeElementwise, "kernels", counted)
    rows = torch.randn(123, 352).to(torch.bfloat16)
    in_place = torch.nn.SiLU(inplace=True)
    with torch.inference_mode(), batch_invariant(model), TailFreeActivations(in_place):
        assert "forward" in vars(activation) and "forward" not in vars(in_place)
        among_others = activation(rows)
        alone = torch.cat([activation(row[None]) for row in rows])
        batch = tokenizer(MIXED_TEXTS[:3], return_tensors="pt", padding=True)
        model(**batch)
        with TailFreeElementwise():
            through_the_kernel = torch.nn.functional.silu(rows)
    assert reached.count(("silu", "CPU")) == 1 and ("sin", "CPU") in reached  # the kernel only when called itself
    assert "forward" not in vars(activation)  # the class's own forward again
    assert torch.equal(among_others, alone) and torch.equal(among_others, through_the_kernel)


@pytest.mark.parametrize(
    "make, approximate",
    [
        (torch.nn.GELU, "none"),
        (lambda: torch.nn.GELU(approximate="tanh"), "tanh"),
        (GELUActivation, "none"),  # ACT2FN["gelu"]
        (GELUTanh, "tanh"),  # ACT2FN["gelu_pytorch_tanh"]: Gemma's
    ],
)
def test_gelu_modules_compute_tail_free_at_the_module_and_a_python_formula_is_left_as_it_is(make, approximate):
    module, formula = make(), GELUActivation(use_gelu_python=True)
    rows = torch.randn(123, 352).to(torch.bfloat16)
    with torch.inference_mode(), TailFreeElementwise(), TailFreeActivations(module), TailFreeActivations(formula):
        assert "forward" in vars(module) and "forward" not in vars(formula)
        among_others = module(rows)
        alone = torch.cat([module(row[None]) for row in rows])
        through_the_kernel = F.gelu(rows, approximate=approximate)
    assert "forward" not in vars(module)
    assert torch.equal(among_others, alone) and torch.equal(among_others, through_the_kernel)


def test_under_the_cpu_s_autocast_the_model_is_probed_again():
    """Autocast changes the dtypes a model's calls are made in (a float32 model's linear layers give bf16): what
    the census found without it does not hold under it."""
    model, _ = _tiny()
    with _passes(model) as passes:
        with batch_invariant(model):
            plain = len(passes)
        with torch.autocast("cpu", dtype=torch.bfloat16), batch_invariant(model):
            pass
    assert len(passes) > plain
