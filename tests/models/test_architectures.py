"""Any causal LM, not one family: tiny random checkpoints of many architectures, each checked against
an independent computation written here (the seed's method, and hooks of our own on every module)."""

import contextlib

import pytest
import torch
from helpers.architectures import ARCHITECTURES, ATTENTION, batched_runs_one_ulp_apart, build_encoder
from helpers.oracle import seed_compare
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core import Settings, compare
from batchtui.core.errors import ModelLoadError
from batchtui.core.models.loading import load_model
from batchtui.core.terminal.plain import format_localization

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

# Lengths 1 to 30 tokens: left padding and arange positions (the seed's) make every padded text diverge,
# whatever the CPU, and texts longer than the 6-token sliding windows exercise them.
TEXTS = ["a", "The quick brown fox jumps over it", "hello world"]


def _every_module_output(model, ids, mask, positions):
    """Our own hooks on every module: (the order they finished, name -> output reshaped to [b, T, -1])."""
    order, outputs = [], {}
    names = {id(m): n for n, m in model.named_modules()}

    def record(module, args, output):
        order.append(names[id(module)])
        tensor = output[0] if isinstance(output, tuple) else output
        if isinstance(tensor, torch.Tensor) and tensor.numel() % ids.numel() == 0:
            outputs[names[id(module)]] = tensor.reshape(*ids.shape, -1).clone()  # as it was, not as edited later

    handles = [m.register_forward_hook(record) for m in model.modules()]
    with torch.no_grad():
        logits = model(
            inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask, position_ids=positions
        ).logits
    for handle in handles:
        handle.remove()
    return list(dict.fromkeys(order)), outputs, logits


def _batched_and_single(path, text_index, attn):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn).eval()
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    length = batch.input_ids.shape[1]
    order, batched, _ = _every_module_output(
        model, batch.input_ids, batch.attention_mask, torch.arange(length).expand(len(TEXTS), -1)
    )
    real = batch.attention_mask[text_index].bool()
    ids = tokenizer(TEXTS[text_index], return_tensors="pt").input_ids
    _, single, _ = _every_module_output(model, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    return order, {n: out[text_index][real] for n, out in batched.items()}, {n: out[0] for n, out in single.items()}


def _rel_l2(batched: torch.Tensor, single: torch.Tensor) -> float:
    b, s = batched.double(), single.double()
    return ((b - s).norm() / s.norm()).item()


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_numbers_and_localization_match_independent_hooks(name, checkpoints, tiny_path):
    path, attn = checkpoints[name], ATTENTION.get(name)
    settings = Settings(model=str(path), dtype="float32", positions="arange", modules=True, attn=attn)
    result = compare(TEXTS, settings)
    oracle = seed_compare(path, TEXTS, torch.float32, "left", positions="arange", attn=attn)
    assert [t.max_abs_diff for t in result.texts] == [o.max_abs_diff for o in oracle]
    assert [t.allclose for t in result.texts] == [o.allclose for o in oracle]
    for t, o in zip(result.texts, oracle):  # the logits' relative L2, ||B - S|| / ||S|| over the text's positions
        assert t.layers[-1].rel_l2 == pytest.approx(_rel_l2(o.batched, o.single), rel=1e-5, abs=1e-12)

    text = result.texts[0]  # "a", left-padded to 30 tokens with shifted positions: it diverges
    assert text.max_abs_diff > 0 and text.first_divergent_module is not None
    kinds = [m.kind for m in text.layers]
    assert kinds == ["embedding", "layer", "layer", "final", "logits"]  # 2 layers and the final norm
    subs = [m for m in text.modules if m.kind == "sub"]
    assert {"attention", "MLP", "norm"} <= {m.role for m in subs}

    order, batched, single = _batched_and_single(path, 0, attn)
    hooked = [m.name for m in text.modules if m.kind not in ("embedding", "logits")]
    assert hooked == [n for n in order if n in hooked]  # the engine's order: the order outputs came
    first = text.first_divergent_module
    for module in text.modules[: first.index]:
        if module.kind != "embedding":
            assert torch.equal(batched[module.name], single[module.name]), module.name
    assert not torch.equal(batched[first.name], single[first.name])
    assert (batched[first.name] - single[first.name]).abs().max().item() == first.max_abs_diff
    for module in text.modules[first.index : -1]:
        assert module.rel_l2 == pytest.approx(_rel_l2(batched[module.name], single[module.name]), rel=1e-5), module.name
    lines = format_localization(result).splitlines()
    for result_text in result.texts:  # never "bitwise equal" for a text whose logits differ
        said = next(line for line in lines if line.startswith(f"text {result_text.line}:"))
        assert ("every module bitwise equal" in said) == (result_text.max_abs_diff == 0), said


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe", "mixtral-near-tie"])
def test_router_swaps_match_independent_hooks(name, checkpoints):
    path = checkpoints[name]
    texts = ["a", "The quick brown fox jumps over the lazy dog again", "hello world", "xyz abc def ghi"]
    settings = Settings(model=str(path), dtype="bfloat16", modules=True)
    # Near ties are crossed by any difference between the runs; a kernel's rounding is one on some CPUs only.
    apart = batched_runs_one_ulp_apart if name == "mixtral-near-tie" else lambda model: contextlib.nullcontext()
    with apart(load_model(settings).model):
        result = compare(texts, settings)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    chosen = {}
    routers = [layer.mlp.gate for layer in model.model.layers]  # known here, independently of the engine
    handles = [
        r.register_forward_hook(lambda m, a, out, i=i: chosen.__setitem__(i, out[2].sort(-1).values))
        for i, r in enumerate(routers)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    mask = batch.attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad(), apart(model):
        embed = model.get_input_embeddings()
        model(inputs_embeds=embed(batch.input_ids), attention_mask=mask, position_ids=positions)
        batched = {i: c.reshape(*mask.shape, -1) for i, c in chosen.items()}
        for row, (text, result_text) in enumerate(zip(texts, result.texts)):
            ids = tokenizer(text, return_tensors="pt").input_ids
            model(
                inputs_embeds=embed(ids),
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(ids.shape[1])[None],
            )
            expected = sorted(
                (p, i)
                for i in range(len(routers))
                for p in (batched[i][row][mask[row].bool()] != chosen[i]).any(-1).nonzero().flatten().tolist()
            )
            assert sorted((c.position, c.layer) for c in result_text.routing_changes) == expected
    for handle in handles:
        handle.remove()
    if name == "mixtral-near-tie":  # one ulp moves tokens to other experts here
        swapped = [t for t in result.texts if t.routing_changes]
        assert swapped
        assert "expert routing changed at" in format_localization(result)


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe"])
def test_float64_runs_on_moe(name, checkpoints):
    result = compare(TEXTS, Settings(model=str(checkpoints[name]), dtype="float64", reference=True, batch_size=1))
    assert result.config["dtype"] == "float64"
    assert all(t.max_abs_diff == 0.0 and t.reference.single == 0.0 for t in result.texts)


def test_an_encoder_is_refused(tmp_path, tiny_path):
    with pytest.raises(ModelLoadError, match="is not a causal LM"):
        compare(["a text"], Settings(model=str(build_encoder(tmp_path / "bert", tiny_path))))


@pytest.mark.parametrize("token", [7, 3])
def test_a_model_giving_nan_logits_is_refused_for_that_not_taken_for_an_encoder(tmp_path, tiny_path, token):
    """NaN in a weight (one embedding row; 7 is the token the load's probe changes, 3 one it always reads) reaches
    the probe's logits: the load says so, where it said "not a causal LM" (NaN reached earlier positions, or their
    run-to-run noise was NaN)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("nan")
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="gives NaN or inf logits for a 6-token text in float32 on cpu"):
        load_model(Settings(model=str(tmp_path), dtype="float32"))


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_batch_size_one_is_bitwise_equal(name, checkpoints):
    settings = Settings(model=str(checkpoints[name]), batch_size=1, attn=ATTENTION.get(name), modules=True)
    result = compare(TEXTS, settings)
    assert all(t.max_abs_diff == 0.0 and t.first_divergent_module is None for t in result.texts)


async def test_app_detail_says_expert_routing_changed_here(checkpoints):
    from helpers.tui_helpers import make_app, settle

    texts = ["a", "The quick brown fox jumps over the lazy dog again", "hello world", "xyz abc def ghi"]
    app = make_app(texts=texts, model=str(checkpoints["mixtral-near-tie"]), positions="mask")
    with batched_runs_one_ulp_apart(load_model(app.state.settings).model):  # the app's model, loaded once
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            text = next(t for t in app.state.comparison.texts if t.routing_changes)
            change = text.routing_changes[0]
            app.select(text.index, change.position)
            await pilot.pause()
            shown = str(app.query_one("#detail-numbers").render())
            assert f"expert routing changed here: layer {change.layer}" in shown


def test_a_kernel_without_the_dtype_is_bad_input_not_a_crash(checkpoints):
    from batchtui.core.errors import InputError

    settings = Settings(model=str(checkpoints["qwen3-moe"]), dtype="float64")
    layer = load_model(settings).model.model.layers[0]

    def grouped_mm_refuses(module, args):
        raise RuntimeError("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double")

    handle = layer.register_forward_pre_hook(grouped_mm_refuses)
    try:
        with pytest.raises(InputError, match="dtype float64 is not usable on cpu"):
            compare(TEXTS, settings)
    finally:
        handle.remove()


def test_a_module_output_edited_in_place_afterwards_is_recorded_as_it_was(checkpoints):
    """Falcon adds its attention output into the MLP's output in place after the MLP returns: the recorded MLP
    output must be what the MLP returned (an independent hook's copy), not the sum."""
    from batchtui.core.run.runner import Runner

    loaded = load_model(Settings(model=str(checkpoints["falcon"]), dtype="float32", modules=True))
    mlp_name = next(name for name, _ in loaded.model.named_modules() if name.endswith("h.0.mlp"))
    returned = {}
    handle = loaded.model.get_submodule(mlp_name).register_forward_hook(
        lambda module, args, output: returned.__setitem__("mlp", output.clone())
    )
    try:
        with torch.inference_mode(), Runner(loaded, "left", "mask", modules=True) as runner:
            recorded = runner.single(loaded.tokenizer("hello world")["input_ids"])
    finally:
        handle.remove()
    index = runner.recording.names.index(mlp_name)
    assert torch.equal(recorded.hidden[index][0], returned["mlp"][0])


def test_a_checkpoint_missing_weights_is_refused_in_one_line(tmp_path, tiny_path, capsys):
    """BART's encoder-decoder weights load into BartForCausalLM with its embeddings and head initialised at
    random (other logits on every load): refused, exit 2, naming them, without transformers' load report."""
    from helpers.architectures import build_seq2seq

    from batchtui.core.cli.check import run_check

    bart = build_seq2seq(tmp_path / "bart", tiny_path)
    capsys.readouterr()  # the checkpoint's own writing
    assert run_check(["hello", "--model", str(bart)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lacks 2 weights the model needs" in err and "lm_head.weight" in err


def test_a_model_that_ignores_position_ids_says_so(tmp_path, tiny_path, checkpoints):
    """Falcon with ALiBi takes its positions from the mask, not from position_ids: the report says that
    --positions changes nothing for it; a rotary model (Llama) gets no such note."""
    import transformers

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    config = transformers.FalconConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "alibi")
    tokenizer.save_pretrained(tmp_path / "alibi")
    result = compare(["hello world"], Settings(model=str(tmp_path / "alibi")))
    assert any("ignores position_ids" in note and "--positions changes nothing" in note for note in result.notes)
    llama = compare(["hello world"], Settings(model=str(checkpoints["llama"])))
    assert not any("position_ids" in note for note in llama.notes)


def test_only_a_projection_onto_the_experts_is_taken_for_a_router(tmp_path, tiny_path):
    """Jamba's Mamba layers hold a norm (`dt_layernorm`) as wide as the number of experts here: it is not a
    router; the one router is the MoE layer's projection onto the experts."""
    import transformers

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    config = transformers.JambaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        mamba_dt_rank=4,
        mamba_d_state=4,
        mamba_expand=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "jamba")
    tokenizer.save_pretrained(tmp_path / "jamba")

    structure = load_model(Settings(model=str(tmp_path / "jamba"))).structure
    assert [name for _, name in structure.routers] == ["model.layers.1.feed_forward.router"]
