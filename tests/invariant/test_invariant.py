"""The batch-invariant mode: a text's batched logits torch.equal its single run's, on every architecture of the
matrix and both built-ins, in bfloat16 and float32, either padding side, any batch size, and every step of
greedy generation; leaving the mode puts everything back. Each exactness test also shows, on the same
workload, that without the mode something differs (float32, left padding, batch 8 diverges on any CPU), so
that it can fail."""

import inspect

import pytest
import torch
import transformers
from helpers.architectures import CHECKPOINTS, load_checkpoint
from helpers.paths import DOCS
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core import NotInvariant, batch_invariant
from batchtui.core.cli.check import run_check
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

# 1 to ~240 tokens in one batch (a token per byte for the tiny checkpoints, whose context is 256 positions).
TEXTS = [
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "xxxxxxx",
    "def f(x):\n    return x + 1",
    "Batched and single runs of the same text should give the same logits. " * 3,
    "日本語のテキスト",
    "The presence of annotations does not change the meaning of a function. " * 3 + "z" * 20,
]
BUILT_INS = ("tiny", "qwen2-english-4m")
MODELS = (*CHECKPOINTS, *BUILT_INS)
DTYPES = (torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def models(checkpoints):
    """The matrix's checkpoints and the built-in models, by name."""
    return {**checkpoints, **{name: builtin_path(name) for name in BUILT_INS}}


def _batched_rows(model, tokenizer, texts, side):
    """The seed's code: one padded batch through inputs_embeds, mask and mask-derived positions; each text's
    real rows of the logits."""
    tokenizer.padding_side = side
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    mask = batch.attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    embeds = model.get_input_embeddings()(batch.input_ids)
    logits = model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).logits
    return [logits[i][mask[i].bool()] for i in range(len(texts))]


def _single(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt").input_ids
    embeds = model.get_input_embeddings()(ids)
    positions = torch.arange(ids.shape[1])[None]
    return model(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), position_ids=positions).logits[0]


def _worst(batched, singles) -> float:
    return max((b.float() - s.float()).abs().max().item() for b, s in zip(batched, singles))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_batched_logits_equal_single_runs_bitwise(models, name):
    for dtype in DTYPES:
        model, tokenizer = load_checkpoint(models[name], name, dtype)
        with torch.inference_mode():
            with batch_invariant(model):
                singles = [_single(model, tokenizer, text) for text in TEXTS]
                for side in ("left", "right"):
                    batched = _batched_rows(model, tokenizer, TEXTS, side)
                    for i, (b, s) in enumerate(zip(batched, singles)):
                        assert torch.equal(b, s), f"{name} {dtype} {side} text {i}: {_worst([b], [s])}"
            if dtype == torch.float32:
                plain_singles = [_single(model, tokenizer, text) for text in TEXTS]
                assert _worst(_batched_rows(model, tokenizer, TEXTS, "left"), plain_singles) > 0, "can fail"


@pytest.mark.parametrize("name", ["qwen2-english-4m", "llama"])
def test_every_batch_size_from_1_to_8(models, name):
    model, tokenizer = load_checkpoint(models[name], name, torch.float32)
    with torch.inference_mode(), batch_invariant(model):
        singles = [_single(model, tokenizer, text) for text in TEXTS]
        for size in range(1, 9):
            for start in range(0, len(TEXTS), size):
                chunk = TEXTS[start : start + size]
                for offset, rows in enumerate(_batched_rows(model, tokenizer, chunk, "left")):
                    assert torch.equal(rows, singles[start + offset]), f"batch {size}, text {start + offset}"


def _greedy(model, tokenizer, texts):
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    out = model.generate(
        **batch,
        max_new_tokens=32,
        min_new_tokens=32,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    return out.sequences[:, batch.input_ids.shape[1] :], torch.stack(out.logits, dim=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_is_the_same_step_by_step(models, name):
    texts = TEXTS[:4]
    for dtype in DTYPES:
        model, tokenizer = load_checkpoint(models[name], name, dtype)
        with torch.inference_mode(), batch_invariant(model):
            tokens, logits = _greedy(model, tokenizer, texts)
            for i, text in enumerate(texts):
                alone_tokens, alone_logits = _greedy(model, tokenizer, [text])
                assert torch.equal(tokens[i], alone_tokens[0]), f"{name} {dtype} text {i}"
                assert torch.equal(logits[i], alone_logits[0]), f"{name} {dtype} text {i}: a step's logits"


def test_without_the_mode_generation_steps_differ(models):
    """The generation test above can fail: the same workload's step logits differ without the mode."""
    model, tokenizer = load_checkpoint(models["qwen2-english-4m"], "qwen2-english-4m", torch.float32)
    with torch.inference_mode():
        _, logits = _greedy(model, tokenizer, TEXTS[:4])
        differs = []
        for i, text in enumerate(TEXTS[:4]):
            _, alone = _greedy(model, tokenizer, [text])
            steps = min(logits.shape[1], alone.shape[1])
            differs.append(not torch.equal(logits[i, :steps], alone[0, :steps]))
    assert any(differs)


def test_the_documented_example_prints_true_for_every_text(capsys):
    """The documented example (docs/invariant.md), the original report's code with `batch_invariant` added, run
    as written on the built-in English model."""

    page = (DOCS / "invariant.md").read_text()
    code = page.split("```python\n")[1].split("```")[0]
    name = 'model_name = "Qwen/Qwen2.5-1.5B-Instruct"'
    assert name in code
    exec(code.replace(name, f"model_name = {str(builtin_path('qwen2-english-4m'))!r}"), {})
    assert capsys.readouterr().out.split() == ["True", "True", "True"]


def test_leaving_the_mode_restores_every_kernel_and_the_attention(models):
    model, tokenizer = load_checkpoint(models["gemma2"], "gemma2", torch.float32)
    a, b = torch.randn(5, 33), torch.randn(33, 7)
    x = torch.randn(3, 37)
    before = torch.mm(a, b), torch.nn.functional.silu(x)
    replaced = ("mm", "addmm", "bmm", "silu", "_grouped_mm", "mean", "sum", "linalg_vector_norm")
    kernels = {op: torch._C._dispatch_dump(f"aten::{op}") for op in replaced}
    attention = model.config._attn_implementation
    for failure in (RuntimeError, KeyboardInterrupt):
        with pytest.raises(failure), batch_invariant(model):
            assert model.config._attn_implementation != attention
            raise failure()
        assert model.config._attn_implementation == attention
        assert torch.equal(torch.mm(a, b), before[0]) and torch.equal(torch.nn.functional.silu(x), before[1])
        assert {op: torch._C._dispatch_dump(f"aten::{op}") for op in kernels} == kernels
    assert type(torch.overrides._get_current_function_mode_stack()) is list
    assert not torch.overrides._get_current_function_mode_stack()


def test_nested_entries_share_one_registration_and_keep_the_model_s_own_attention(models):
    """Gemma2's eager attention soft-caps its scores (SDPA does not): a nested entry must still run it per row."""
    model, tokenizer = load_checkpoint(models["gemma2"], "gemma2", torch.float32)
    dump = torch._C._dispatch_dump("aten::mm")
    with torch.inference_mode(), batch_invariant(model):
        outer = _batched_rows(model, tokenizer, TEXTS[:3], "left")
        with batch_invariant(model):
            inside = torch._C._dispatch_dump("aten::mm")
            nested = _batched_rows(model, tokenizer, TEXTS[:3], "left")
        assert torch._C._dispatch_dump("aten::mm") == inside != dump
        assert all(torch.equal(a, b) for a, b in zip(outer, nested))
        assert all(torch.equal(a, b) for a, b in zip(outer, _batched_rows(model, tokenizer, TEXTS[:3], "left")))
    assert torch._C._dispatch_dump("aten::mm") == dump and model.config._attn_implementation == "eager"


def _tiny_config(name, vocab):
    if name == "mamba":
        return transformers.MambaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2)
    if name == "falcon-h1":  # a Mamba mixer beside attention in every layer
        return transformers.FalconH1Config(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1,
            mamba_d_state=8, mamba_chunk_size=16, max_position_embeddings=256,
        )  # fmt: skip
    return transformers.FalconConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=name == "falcon-alibi"
    )


@pytest.fixture(scope="module")
def outside_the_matrix(tmp_path_factory, tiny_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    folder = tmp_path_factory.mktemp("outside")
    paths = {}
    for name in ("mamba", "falcon", "falcon-alibi", "falcon-h1"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_tiny_config(name, len(tokenizer)))
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        paths[name] = folder / name
    return paths


def test_a_model_without_attention_in_its_layers_is_refused_with_the_reason(outside_the_matrix):
    model = AutoModelForCausalLM.from_pretrained(outside_the_matrix["mamba"]).eval()
    with pytest.raises(NotInvariant, match=r"2 of 2 layers .* mix tokens without attention"):
        with batch_invariant(model):
            pass


def test_a_model_mixing_tokens_beside_its_attention_is_refused_with_the_reason(outside_the_matrix, capsys):
    """Falcon-H1 attends once per layer, so counting attention calls lets it through; its Mamba mixer is found by
    what it does: with every query attending only itself, the first token still reaches the last position."""
    model = AutoModelForCausalLM.from_pretrained(outside_the_matrix["falcon-h1"]).eval()
    with pytest.raises(NotInvariant, match=r"FalconH1ForCausalLM mixes tokens beside its attention .*: not covered"):
        with batch_invariant(model):
            pass
    assert run_check(["hello", "a b c", "--model", str(outside_the_matrix["falcon-h1"]), "--invariant"]) == 2
    assert "mixes tokens beside its attention" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["falcon", "falcon-alibi"])
def test_attention_a_model_calls_itself_is_caught(outside_the_matrix, name):
    """Falcon (before transformers 5.25) calls scaled_dot_product_attention itself, not through transformers'
    interface, with ALiBi in its float mask for one variant: caught either way; its own eager attention is
    refused where the model computes it outside the interface, and covered where it goes through it."""
    model, tokenizer = load_checkpoint(outside_the_matrix[name], name, torch.float32)
    with torch.inference_mode():
        with batch_invariant(model):
            singles = [_single(model, tokenizer, text) for text in TEXTS]
            for side in ("left", "right"):
                batched = _batched_rows(model, tokenizer, TEXTS, side)
                assert all(torch.equal(b, s) for b, s in zip(batched, singles)), side
        eager = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    if "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(inspect.getmodule(type(model))):
        # transformers 5.25 on: Falcon's eager attention goes through the interface too, and is covered.
        with torch.inference_mode(), batch_invariant(model):
            singles = [_single(model, tokenizer, text) for text in TEXTS]
            batched = _batched_rows(model, tokenizer, TEXTS, "left")
            assert all(torch.equal(b, s) for b, s in zip(batched, singles))
    else:  # before: Falcon's own eager attention is out of reach, and refused
        with pytest.raises(NotInvariant, match="outside transformers' attention interface"), batch_invariant(model):
            pass
    model.config._attn_implementation = eager


async def test_the_app_keeps_the_mode_on_while_exploring():
    """`i` (or the settings checkbox) turns the mode on: the same texts rerun, and the heatmap and the status
    line show what it leaves (nothing, here)."""
    from helpers.tui_helpers import make_app, settle
    from textual.widgets import Checkbox

    from batchtui.tui.widgets.status_line import StatusLine

    app = make_app(dtype="float32", positions="mask")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert not all(t.bitwise_equal for t in app.state.comparison.texts), "float32, left padding: some text differs"
        await pilot.press("i")
        await settle(pilot, app)
        assert app.state.comparison.config["invariant"] is True
        assert app.query_one("#invariant", Checkbox).value is True
        assert all(t.bitwise_equal for t in app.state.comparison.texts)
        total = len(app.state.comparison.texts)
        status = app.query_one(StatusLine)
        assert f"invariant mode: bitwise: all {total} texts equal their single runs" in status.full_text()  # F1
        headline = f"0/{total} texts diverge (allclose) · 0 flips · invariant mode: all {total} texts bitwise"
        assert headline in str(status.render())
        await pilot.press("i")
        await settle(pilot, app)
        assert app.state.comparison.config["invariant"] is False


def test_check_remedy_invariant_reports_bitwise_and_keeps_the_math(tmp_path, capsys):
    """`check --remedy invariant`: the JSON entry says applied, bitwise on every text, and the distance to the
    float64 reference of the order of the runs' without the mode (where a float32 linear layer takes oneDNN's
    kernel in the mode, its sums run in another order: as far from float64 within a factor of two, not closer or
    further by construction)."""
    import json

    out = tmp_path / "check.json"
    args = ["--model", "tiny", "--dtype", "float32", "--reference", "--remedy", "invariant", "--json", str(out)]
    code = run_check([*TEXTS[:5], *args])
    report = json.loads(out.read_text())
    baseline, invariant = report["remedies"]
    assert baseline["bitwise_equal"] < 5, "float32, left padding: without the mode some text differs"
    assert invariant["applied"] is True and invariant["config"]["invariant"] is True
    assert invariant["bitwise_equal"] == 5 and invariant["summary"]["max_abs_diff"] == 0
    assert invariant["note"] == "bitwise: all 5 texts equal their single runs"
    envelope = max(baseline["reference"]["batched_vs_float64"], baseline["reference"]["single_vs_float64"])
    assert invariant["reference"]["batched_vs_float64"] <= 2 * envelope
    assert code == 0  # the exit code follows the run with the remedy applied
    printed = capsys.readouterr().out
    assert "invariant" in printed and "5/5" in printed


@pytest.mark.slow
def test_generate_remedy_invariant_and_the_invariant_flag(tmp_path):
    import json

    from batchtui.core.cli.generate import run_generate

    out = tmp_path / "generate.json"
    args = ["--model", "qwen2-english-4m", "--dtype", "float32", "--max-new-tokens", "8", "--json", str(out)]
    run_generate([*TEXTS[:4], *args, "--remedy", "invariant"])
    remedies = json.loads(out.read_text())["remedies"]
    assert [r["remedy"] for r in remedies] == ["none", "invariant"]
    assert remedies[1]["summary"] == {
        "texts": 4, "differ": 0, "near_ties": 0, "max_abs_diff": 0.0, "trainer_vs_sampler": None, "trl_parts": None
    }  # fmt: skip
    assert remedies[1]["bitwise_equal"] == 4
    assert run_generate([*TEXTS[:4], *args, "--invariant"]) == 0
    assert json.loads(out.read_text())["config"]["invariant"] is True


def test_a_model_out_of_reach_is_not_applied_and_says_why(outside_the_matrix, tmp_path):
    import json

    out = tmp_path / "check.json"
    mamba = str(outside_the_matrix["mamba"])
    run_check(["hello", "a b c", "--model", mamba, "--remedy", "invariant", "--json", str(out)])
    entry = json.loads(out.read_text())["remedies"][1]
    assert entry["applied"] is False and entry["summary"] is None
    assert "mix tokens without attention" in entry["note"]
    assert run_check(["hello", "--model", mamba, "--invariant"]) == 2  # a clear refusal


async def test_the_remedies_screen_measures_the_mode():
    from helpers.tui_helpers import make_app, measured_remedy, settle
    from textual.widgets import DataTable

    app = make_app(dtype="float32", positions="mask")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        screen = await measured_remedy(pilot, app, "invariant")
        table = screen.query_one(DataTable)
        bitwise = [str(column.label) for column in table.columns.values()].index("bitwise")
        texts = len(screen.outcomes[1].comparison.texts)
        assert table.get_row_at(1)[bitwise] == f"{texts}/{texts}"
        assert str(table.get_row_at(1)[-1]) == f"bitwise: all {texts} texts equal their single runs"


@pytest.mark.parametrize("name", BUILT_INS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_padded_batch_without_position_ids_gets_each_row_s_own_positions(models, name, dtype):
    """A trainer's loss forward often passes the mask alone (TRL's GRPO trainer): the library then numbers a
    left-padded row's tokens from its padding, so its logits depend on how much padding the other rows gave it. In
    the mode a row's positions count from its first real token, as generate's do: every row equals its text alone,
    bitwise, left or right padded; position ids a caller gives are left as they are."""
    model = AutoModelForCausalLM.from_pretrained(models[name], dtype=dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(models[name])
    texts = TEXTS[:4]
    with torch.inference_mode():
        alone = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]
        tokenizer.padding_side = "left"
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        library = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        # (the library numbers the padded row from its padding: rotations by other angles, other roundings)
        assert not torch.equal(library[1, -alone[1].shape[0] :], alone[1])
        with batch_invariant(model):
            singles = [model(**tokenizer(text, return_tensors="pt")).logits[0] for text in texts]
        for side in ("left", "right"):
            tokenizer.padding_side = side
            batch = tokenizer(texts, return_tensors="pt", padding=True)
            with batch_invariant(model):
                logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                arange = torch.arange(batch.input_ids.shape[1]).expand_as(batch.input_ids)
                given = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=arange)
            for row, single in enumerate(singles):
                real = batch.attention_mask[row].bool()
                assert torch.equal(logits[row][real], single), (side, row)
            if side == "left":  # the caller's arange kept: the padded row is not its text alone
                assert not torch.equal(given.logits[1][batch.attention_mask[1].bool()], singles[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_s_backward_runs_in_the_mode_with_the_library_s_gradients(models, name):
    """loss.backward() through logits computed in the mode, in training mode (dropout 0, as a trainer runs): it
    runs on every architecture of the matrix, MoE experts' grouped products included, and its gradients are the
    plain computation's (the mode's backward is the library's: close, not bitwise)."""
    from batchtui.core.run.trainer_forward import trainer_modes

    model = AutoModelForCausalLM.from_pretrained(models[name], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(models[name])
    batch = tokenizer(TEXTS[:3], return_tensors="pt", padding=True)
    mask = batch.attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)

    def gradients() -> list:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions).logits
        (logits.float().log_softmax(-1)[mask.bool()].mean()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    with trainer_modes(model):
        library = gradients()
        with batch_invariant(model):
            in_mode = gradients()
    assert len(in_mode) == len(library) and all(torch.isfinite(g).all() for g in in_mode)
    for got, want in zip(in_mode, library):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


def test_randomness_in_training_is_refused_in_one_line_and_eval_runs():
    """A router's jitter noise (PhiMoE's) or a dropout above 0, in training: every forward draws, no two arrivals
    agree: NotInvariant naming it; the same model in eval() runs."""
    config = transformers.PhimoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_experts_per_tok=2, num_local_experts=4, max_position_embeddings=64,
        router_jitter_noise=0.01, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).float()
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    model.train()
    with pytest.raises(NotInvariant, match="router_jitter_noise .0.01. in training"), batch_invariant(model):
        model(input_ids=ids)
    for holder in (config, *(m for m in model.modules() if "router_jitter_noise" in vars(m))):
        holder.router_jitter_noise = 0.0  # (the router keeps its own copy of the config's)
    dropout = torch.nn.Dropout(0.1)
    model.model.add_module("extra_dropout", dropout)
    with pytest.raises(NotInvariant, match="dropout 0.1 at model.extra_dropout"), batch_invariant(model):
        model(input_ids=ids)
    model.eval()
    with torch.inference_mode(), batch_invariant(model):
        assert torch.isfinite(model(input_ids=ids).logits).all()
