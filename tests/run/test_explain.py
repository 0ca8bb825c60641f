"""Localization, decomposition, reference and ULP: checked against independent computations."""

import pytest
import torch
from conftest import MIXED_TEXTS
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core import Settings, compare
from batchtui.core.numbers.metrics import ulp

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


def _hooked_outputs(model, names):
    captured = {}
    modules = dict(model.named_modules())
    handles = [
        modules[name].register_forward_hook(
            lambda m, a, out, name=name: captured.__setitem__(name, out[0] if isinstance(out, tuple) else out)
        )
        for name in names
    ]
    return captured, handles


def test_first_divergent_module_truly_differs_and_all_before_are_equal(tiny_path):
    settings = Settings(model="tiny", dtype="bfloat16", positions="arange", modules=True, batch_size=len(MIXED_TEXTS))
    result = compare(MIXED_TEXTS, settings)
    text = max(result.texts, key=lambda t: t.max_abs_diff)
    first = text.first_divergent_module
    assert first is not None and first.name.startswith("model.layers.")
    names = [m.name for m in text.modules[1 : first.index + 1]]  # everything after the embeddings

    # Independently: the seed's method with our own hooks on the same modules.
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).eval()
    embed = model.get_input_embeddings()
    captured, handles = _hooked_outputs(model, names)
    with torch.no_grad():
        batch = tokenizer(MIXED_TEXTS, return_tensors="pt", padding=True)
        length = batch.input_ids.shape[1]
        model(
            inputs_embeds=embed(batch.input_ids),
            attention_mask=batch.attention_mask,
            position_ids=torch.arange(length).expand(len(MIXED_TEXTS), -1),
        )
        batched = {name: out[text.index][batch.attention_mask[text.index].bool()] for name, out in captured.items()}
        ids = tokenizer(text.text, return_tensors="pt").input_ids
        model(
            inputs_embeds=embed(ids), attention_mask=torch.ones_like(ids), position_ids=torch.arange(ids.shape[1])[None]
        )
        single = {name: out[0] for name, out in captured.items()}
    for handle in handles:
        handle.remove()
    for name in names[:-1]:
        assert torch.equal(batched[name], single[name]), name
    assert not torch.equal(batched[first.name], single[first.name])
    assert (batched[first.name].float() - single[first.name].float()).abs().max().item() == first.max_abs_diff


def test_module_view_contains_the_layer_view():
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16", positions="arange", modules=True))
    for text in result.texts:
        by_name = {m.name: m for m in text.modules}
        assert [by_name[layer.name] == layer for layer in text.layers] == [True] * len(text.layers)
        subs = [m.name.split(".")[-1] for m in text.modules if m.name.startswith("model.layers.0.")]
        assert subs == ["input_layernorm", "self_attn", "post_attention_layernorm", "mlp"]


def test_same_length_texts_have_no_padding_effect():
    texts = ["abcdefgh", "ijklmnop", "qrstuvwx", "12345678"]  # 8 bytes each: no padding at all
    result = compare(texts, Settings(model="tiny", dtype="float32", decompose=True))
    for text in result.texts:
        assert text.decomposition.padding_effect == 0.0
        assert text.decomposition.batch_effect == text.max_abs_diff


def test_batch_of_one_per_chunk_has_no_batch_effect():
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16", batch_size=1, decompose=True))
    for text in result.texts:
        assert text.decomposition.batch_effect == 0.0 and text.decomposition.padding_effect == 0.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_two_effects_bound_the_divergence(dtype):
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype=dtype, positions="arange", decompose=True))
    for text in result.texts:
        d = text.decomposition
        assert text.max_abs_diff <= d.batch_effect + d.padding_effect + 1e-6  # triangle inequality
    assert any(t.decomposition.padding_effect > 0 for t in result.texts)


def test_float64_reference():
    result = compare(MIXED_TEXTS, Settings(model="tiny", dtype="float64", reference=True, batch_size=1))
    for text in result.texts:
        assert text.reference.single == 0.0  # the same float64 model on the same CPU
        assert text.reference.batched == 0.0
    bf16 = compare(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16", reference=True))
    assert all(t.reference.single > 1e-3 for t in bf16.texts)  # bf16 itself is far from float64


def test_max_abs_diff_in_ulps(tiny_path):
    from helpers.oracle import seed_compare

    settings = Settings(model="tiny", dtype="bfloat16", positions="arange", batch_size=len(MIXED_TEXTS))
    result = compare(MIXED_TEXTS, settings)
    oracle = seed_compare(tiny_path, MIXED_TEXTS, torch.bfloat16, "left", positions="arange")
    for text, ref in zip(result.texts, oracle):
        single = ref.single.float()
        for p in text.positions:
            # bf16 has 8 significant bits: the spacing at |x| in [2^e, 2^(e+1)) is 2^(e-7).
            magnitude = single[p.index].abs().max().item()
            spacing = 2.0 ** (torch.tensor(magnitude).log2().floor().item() - 7)
            assert p.max_abs_diff_ulp == pytest.approx(p.max_abs_diff / spacing)
        assert text.max_abs_diff_ulp == max(p.max_abs_diff_ulp for p in text.positions)
    assert ulp(torch.tensor([1.0, 3.0, 0.5]), torch.bfloat16).tolist() == [2**-7, 2**-6, 2**-8]
    assert ulp(torch.tensor([1.0]), torch.float32).item() == 2**-23
