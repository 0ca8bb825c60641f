"""The mode in a decoding step: a pass of one new position per row over a cache. A text alone and the same text in
a batch take the same phases at the same steps, so the mode computes a decoding step's products another way (each
row as the library computes one row alone, where the library keeps rows only from more rows) and the bits still
agree; the whole-model proof is test_invariant's generation matrix."""

import pytest
import torch

from batchtui.core.invariant import rows as invariant_rows
from batchtui.core.invariant.mode import batch_invariant
from batchtui.core.invariant.phase import decoding, tracking_phases
from batchtui.core.models.loading import load_model
from batchtui.core.settings import Settings


def _linear_layers(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _batch(tokenizer, texts):
    tokenizer.padding_side = "left"
    return tokenizer(texts, return_tensors="pt", padding=True)


def test_the_mode_tells_a_decoding_step_from_a_prefill():
    """`decoding()` inside the model's passes: false in the prefill over the prompt (and in a pass without a
    cache), true in each later step of one new position; false outside any pass; the hooks gone on exit."""
    model = load_model(Settings(model="tiny", dtype="float32")).model
    tokenizer = load_model(Settings(model="tiny", dtype="float32")).tokenizer
    seen: list[tuple[int, bool]] = []
    layer = _linear_layers(model)[0]
    hook = layer.register_forward_pre_hook(lambda module, args: seen.append((args[0].shape[1], decoding())))
    ids = tokenizer(["a prompt of a few words"], return_tensors="pt")
    try:
        with tracking_phases(model), torch.inference_mode():
            model.generate(**ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            assert not decoding()
            model(**ids)
    finally:
        hook.remove()
    prompt = ids["input_ids"].shape[1]
    assert seen == [(prompt, False), (1, True), (1, True), (1, True), (prompt, False)]
    assert not model._forward_pre_hooks and not model._forward_hooks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decoding_step_s_rows_are_each_the_library_s_row_alone_where_that_keeps_rows(dtype, monkeypatch):
    """In a batched generation in the mode, every float32 linear layer's decoding call takes `alone` exactly where
    the library (measured) keeps rows only from more than one row and `alone` keeps them from one; where it does,
    each row of the step equals the library's own call on that row alone (computed here outside the mode)."""
    monkeypatch.setattr(invariant_rows, "_measured", {})
    monkeypatch.setattr(invariant_rows, "_chosen", {})
    loaded = load_model(Settings(model="tiny", dtype=dtype))
    model = loaded.model
    calls: list[tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]] = []

    def record(module, args, output):
        if decoding():
            calls.append((module, args[0].detach().clone(), output.detach().clone()))

    hooks = [layer.register_forward_hook(record) for layer in _linear_layers(model)]
    batch = _batch(loaded.tokenizer, ["one", "a longer text of words", "a text"])
    try:
        with batch_invariant(model), torch.inference_mode():
            model.generate(**batch, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    finally:
        for hook in hooks:
            hook.remove()
    chosen = {
        (c.key[0][1], c.key[0][2]): c
        for c in invariant_rows.chosen_paths()
        if c.key[0][0] == "linear" and c.key[-1] == "decoding"
    }
    shapes = {(m.weight.shape, m.bias is not None) for m, _, _ in calls}
    # Offered in float32 and float64 only: bf16's batched one-row products run a plain loop on CPU.
    assert calls and len(chosen) == (len(shapes) if dtype == "float32" else 0)
    for choice in chosen.values():
        wanted = choice.heights["library"] != 1 and choice.heights.get(invariant_rows.ALONE) == 1
        assert (choice.path == invariant_rows.ALONE) == wanted, choice
    for module, inputs, output in calls:
        choice = chosen.get((module.weight.shape, module.bias is not None))
        if choice is None or choice.path != invariant_rows.ALONE:
            continue
        rows_in, rows_out = inputs.reshape(-1, module.in_features), output.reshape(-1, module.out_features)
        assert rows_in.shape[0] == 3  # one new position per text
        for row in range(3):
            with torch.inference_mode():
                alone = torch.nn.functional.linear(rows_in[row : row + 1], module.weight, module.bias)
            assert torch.equal(rows_out[row], alone[0])
