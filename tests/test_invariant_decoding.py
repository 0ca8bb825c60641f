"""A small float32 layer's rows, in a prefill and in a decoding step alike, each as the library computes one row alone
where the library keeps rows only from more rows (a decoding step's one row then goes through the library's very call,
and a prefill's rows get the same bits: test_invariant_arrival); the whole-model proof is test_invariant's and
test_invariant_arrival's matrix."""

import pytest
import torch

from batchtui.core.invariant import rows as invariant_rows
from batchtui.core.invariant.mode import batch_invariant
from batchtui.core.models.loading import load_model
from batchtui.core.settings import Settings


def _linear_layers(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _batch(tokenizer, texts):
    tokenizer.padding_side = "left"
    return tokenizer(texts, return_tensors="pt", padding=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_s_rows_are_each_the_library_s_row_alone_where_that_keeps_rows(dtype, monkeypatch):
    """In a batched generation in the mode, every float32 linear layer takes `alone` exactly where the library
    (measured) keeps rows only from more than one row and `alone` keeps them from one; where it does, each row of a
    call, the prefill's and every decoding step's, equals the library's own call on that row alone (computed here
    outside the mode)."""
    monkeypatch.setattr(invariant_rows, "_measured", {})
    monkeypatch.setattr(invariant_rows, "_chosen", {})
    loaded = load_model(Settings(model="tiny", dtype=dtype))
    model = loaded.model
    calls: list[tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]] = []

    def record(module, args, output):
        calls.append((module, args[0].detach().clone(), output.detach().clone()))

    batch = _batch(loaded.tokenizer, ["one", "a longer text of words", "a text"])
    with batch_invariant(model), torch.inference_mode():  # (its entry's probe passes not recorded)
        hooks = [layer.register_forward_hook(record) for layer in _linear_layers(model)]
        try:
            model.generate(**batch, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        finally:
            for hook in hooks:
                hook.remove()
    chosen = {
        (c.key[0][1], c.key[0][2]): c
        for c in invariant_rows.chosen_paths()
        if c.key[0][0] == "linear" and c.key[-1] == "alone offered"
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
        for row in range(rows_in.shape[0]):
            with torch.inference_mode():
                alone = torch.nn.functional.linear(rows_in[row : row + 1], module.weight, module.bias)
            assert torch.equal(rows_out[row], alone[0]), (module, rows_in.shape, row)
