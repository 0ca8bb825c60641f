"""Generation divergence: batchtui's greedy continuations, batched and alone, checked against transformers'
`generate` called directly here (left-padded batch vs each text alone), on the built-in model and on two
other architectures; the invariants (batch size 1, float64) and a split forced where one must occur."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.tui_helpers import batch_variant
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core import Settings
from batchtui.core.cli.generate import run_generate
from batchtui.core.errors import InputError
from batchtui.core.run.generation_run import generate_and_compare

TEXTS = ["a", "The quick brown fox jumps over the lazy dog.", "Hello, world! How are you?", "xyz"]
NEW = 12
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def _trimmed(tokens: list[int], eos: set[int]) -> list[int]:
    end = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if end is None else tokens[: end + 1]


def hf_continuations(path, texts, dtype: str, batch_size: int, new: int = NEW):
    """The oracle: `generate` on a freshly loaded model, each chunk left-padded by the tokenizer, each
    text alone; continuations cut after the first EOS. Returns [(single, batched, split step)] per text."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).eval()
    config_eos = model.generation_config.eos_token_id
    eos = {tokenizer.eos_token_id, *(config_eos if isinstance(config_eos, list) else [config_eos])} - {None}
    greedy = {"max_new_tokens": new, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    results = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            batch = tokenizer(chunk, return_tensors="pt", padding=True)
            batched = model.generate(**batch, **greedy)[:, batch.input_ids.shape[1] :]
            for row, text in enumerate(chunk):
                ids = tokenizer(text, return_tensors="pt").input_ids
                single = model.generate(ids, attention_mask=torch.ones_like(ids), **greedy)[0, ids.shape[1] :]
                s, b = _trimmed(single.tolist(), eos), _trimmed(batched[row].tolist(), eos)
                split = next((i for i in range(min(len(s), len(b))) if s[i] != b[i]), None)
                results.append((s, b, split))
    return results


def _ours(path, texts, dtype, batch_size, **kwargs):
    comparison = generate_and_compare(
        texts, Settings(model=str(path), dtype=dtype, batch_size=batch_size), NEW, **kwargs
    )
    return comparison, [(list(t.single.token_ids), list(t.batched.token_ids), t.split_step) for t in comparison.texts]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_continuations_and_splits_match_generate_called_directly(tiny_path, dtype):
    comparison, ours = _ours(tiny_path, TEXTS, dtype, batch_size=3)
    assert ours == hf_continuations(tiny_path, TEXTS, dtype, batch_size=3)
    assert comparison.config["padding_side"] == "left" and comparison.config["max_new_tokens"] == NEW
    for t in comparison.texts:
        # Up to the split both runs read the same prefix: one compared step per shared token, no more.
        compared = t.split_step + 1 if t.differs else min(len(t.single.token_ids), len(t.batched.token_ids))
        assert len(t.step_metrics) == compared
        if t.differs:
            assert t.split.top1_flip or t.split.margin == 0  # the choice changed: a flip or an exact tie
            assert t.near_tie == (t.split.margin <= 2 * t.split.max_abs_diff)


@pytest.mark.parametrize("name", ["gpt2", "mixtral"])
def test_other_architectures_match_generate_called_directly(checkpoints, name):
    path = checkpoints[name]
    for dtype in ("float32", "bfloat16"):
        _, ours = _ours(path, TEXTS, dtype, batch_size=4)
        assert ours == hf_continuations(path, TEXTS, dtype, batch_size=4), dtype


def test_first_step_logits_are_the_prompts_next_token_logits(tiny_path):
    """Step 0's max|Δ| is that of the two runs' logits at the prompt's last token, computed here."""
    comparison, _ = _ours(tiny_path, TEXTS, "bfloat16", batch_size=4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).eval()
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=1,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
        for row, t in enumerate(comparison.texts):
            ids = tokenizer(t.text, return_tensors="pt").input_ids
            alone = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=1,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )
            expected = (out.logits[0][row].float() - alone.logits[0][0].float()).abs().max().item()
            assert t.step_metrics[0].max_abs_diff == pytest.approx(expected, abs=0, rel=1e-6)
            assert t.step_metrics[0].token_id == ids[0, -1].item()  # step 0 reads the prompt's last token


def test_batch_size_one_and_float64_never_split(tiny_path):
    single, _ = _ours(tiny_path, TEXTS, "bfloat16", batch_size=1)
    assert single.summary.differ == 0
    assert all(t.single == t.batched and t.max_abs_diff == 0 for t in single.texts)
    exact, _ = _ours(tiny_path, TEXTS, "float64", batch_size=4)
    assert exact.summary.differ == 0 and exact.summary.max_abs_diff < 1e-9


def test_a_forced_split_is_found_at_the_step_generate_gives(tiny_path):
    settings = Settings(model=str(tiny_path), dtype="float64", batch_size=4)
    with batch_variant(settings, amplitude=2e-3):
        comparison = generate_and_compare(TEXTS, settings, NEW)
        tokenizer = AutoTokenizer.from_pretrained(tiny_path)
        tokenizer.padding_side = "left"
        from batchtui.core.models.loading import load_model

        model = load_model(settings).model  # the same hooked model, called directly
        batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
        greedy = {"max_new_tokens": NEW, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
        with torch.no_grad():
            batched = model.generate(**batch, **greedy)[:, batch.input_ids.shape[1] :]
    assert comparison.summary.differ >= 1
    for row, t in enumerate(comparison.texts):
        assert list(t.batched.token_ids) == batched[row].tolist()[: len(t.batched.token_ids)]
        if t.differs:
            assert t.batched.token_ids[: t.split_step] == t.single.token_ids[: t.split_step]
            assert t.batched.token_ids[t.split_step] != t.single.token_ids[t.split_step]
            assert t.split.topk_batch[0].id == t.batched.token_ids[t.split_step]
            assert t.split.topk_single[0].id == t.single.token_ids[t.split_step]


def test_inputs_embeds_path_gives_the_same_continuations(tiny_path):
    _, from_ids = _ours(tiny_path, TEXTS, "float32", batch_size=4)
    _, from_embeds = _ours(tiny_path, TEXTS, "float32", batch_size=4, from_embeds=True)
    assert from_embeds == from_ids


def test_bad_settings_are_refused_before_generating(tiny_path):
    with pytest.raises(InputError, match="max new tokens"):
        generate_and_compare(["a"], Settings(model=str(tiny_path)), 0)
    with pytest.raises(InputError, match="context"):
        generate_and_compare(["a " * 100], Settings(model=str(tiny_path), max_tokens=100), 8192)


def test_cli_exit_codes_table_and_json(tiny_path, tmp_path, capsys):
    report = tmp_path / "g.json"
    args = ["--model", str(tiny_path), "--max-new-tokens", "6", "--json", str(report)]
    assert run_generate([*args, "--batch-size", "1", "--dtype", "bfloat16", *TEXTS]) == 0
    out = capsys.readouterr().out
    assert "0 of 4 continuations differ" in out and out.count(" same ") >= 4
    data = json.loads(report.read_text())
    assert data["summary"]["differ"] == 0 and len(data["texts"]) == 4
    first = data["texts"][0]
    assert {"single", "batched", "split_step", "near_tie", "steps"} <= set(first)
    assert first["split_step"] is None and first["single"] == first["batched"]
    assert run_generate(["--model", str(tiny_path), "--max-new-tokens", "0", "a"]) == 2
    assert "--max-new-tokens: must be a whole number of at least 1" in capsys.readouterr().err


def test_cli_says_a_split_and_exits_1(tiny_path, tmp_path, capsys):
    settings = Settings(model=str(tiny_path), dtype="float64")
    with batch_variant(settings, amplitude=2e-3):
        code = run_generate(["--model", str(tiny_path), "--dtype", "float64", "--max-new-tokens", str(NEW), *TEXTS])
    out = capsys.readouterr().out
    assert code == 1
    assert "continuations differ" in out and not out.startswith("0 of")


def test_views_mark_the_shared_prefix_the_split_and_what_follows(tiny_path):
    from batchtui.tui.views.generation_screen import continuation_tokens, describe_split, step_curve

    settings = Settings(model=str(tiny_path), dtype="float64", batch_size=4)
    with batch_variant(settings, amplitude=2e-3):
        comparison = generate_and_compare(TEXTS, settings, NEW)
    for t in comparison.texts:
        for run in ("single", "batched"):
            tokens = continuation_tokens(t, run)
            assert len(tokens) == len(getattr(t, run).token_ids)
            states = [token.state for token in tokens]
            if t.differs:
                assert states == ["shared"] * t.split_step + ["split"] + ["after"] * (len(tokens) - t.split_step - 1)
                assert describe_split(t).startswith(f"split at step {t.split_step}")
            else:
                assert set(states) <= {"shared"} and describe_split(t) == f"same for {len(tokens)} tokens"
        curve = step_curve(t)
        assert len(curve.steps) == len(t.step_metrics)
        for value, p in zip(curve.log10_max_abs_diff, t.step_metrics):
            assert value is None if p.max_abs_diff == 0 else value == pytest.approx(math.log10(p.max_abs_diff))


def test_sweep_generate_counts_differing_continuations(tiny_path, capsys):
    from batchtui.core.cli.sweep import run_sweep

    args = ["--model", str(tiny_path), "--generate", "--max-new-tokens", "6", "--dtypes", "float32"]
    assert run_sweep([*args, "--batch-sizes", "1", *TEXTS]) == 0
    out = capsys.readouterr().out
    assert "differ" in out and "near-ties" in out and f"0/{len(TEXTS)}" in out
    settings = Settings(model=str(tiny_path), dtype="float64")
    with batch_variant(settings, amplitude=2e-3):
        code = run_sweep(
            [
                "--model",
                str(tiny_path),
                "--generate",
                "--max-new-tokens",
                str(NEW),
                "--dtypes",
                "float64",
                "--batch-sizes",
                "1,4",
                *TEXTS,
            ]
        )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert code == 1 and rows[0][4] == f"0/{len(TEXTS)}" and rows[1][4] != f"0/{len(TEXTS)}"


@pytest.mark.slow
@pytest.mark.parametrize("invariant", [False, True], ids=["plain", "invariant"])
def test_decode_vs_prefill_matches_generate_and_a_prefill_here(tiny_path, invariant):
    """Each decode step's logits (generate, KV cache) against one forward of prompt + continuation, computed here
    independently; where they differ the first module named is one of the model's, and float64 never differs in a
    way the engine misses."""
    from batchtui.core import batch_invariant

    settings = Settings(model="tiny", dtype="bfloat16", invariant=invariant)
    result = generate_and_compare(TEXTS, settings, max_new_tokens=NEW, vs_prefill=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).eval()
    names = dict(model.named_modules())
    mode = batch_invariant(model) if invariant else torch.inference_mode()
    with torch.inference_mode(), mode:
        for text, measured in zip(TEXTS, result.texts):
            ids = tokenizer(text, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=NEW, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
            new = list(measured.single.token_ids)
            decoded = torch.stack(out.logits[: len(new)])[:, 0].to(torch.bfloat16).float()
            sequence = torch.tensor([ids[0].tolist() + new[:-1]])
            prefilled = model(input_ids=sequence).logits[0, ids.shape[1] - 1 :].float()
            expected = (decoded - prefilled).abs().amax(dim=-1).tolist()
            assert list(measured.vs_prefill.max_abs_diff) == expected
            first = next((step for step, d in enumerate(expected) if d != 0), None)
            assert measured.vs_prefill.first_differing_step == first
            assert (measured.vs_prefill.first_module is None) == (first is None)
            assert first is None or measured.vs_prefill.first_module in names


def test_a_generation_s_checks_are_named_in_its_progress_never_a_bare_measuring():
    """The app's status line during a generation with both checks: the passes, then the checks by name and step,
    counted to the run's own total (a minute of "measuring" on a large model said nothing)."""
    from batchtui.core.run.generation_run import generate_and_compare
    from batchtui.core.run.skeleton import generation_stage

    checks = ("decode vs prefill", "trainer vs sampler")
    calls: list[tuple[int, int]] = []
    texts = ["one two three", "four", "five six"]
    generate_and_compare(texts, Settings(model="tiny", batch_size=2), 3, progress=lambda d, t: calls.append((d, t)),
                         vs_prefill=True, vs_trainer=True)  # fmt: skip
    labels = [generation_stage(done, total, len(texts), 2, checks) for done, total in calls]
    assert "measuring" not in labels and labels[0].startswith("single passes")
    named = [label for label in labels if label.startswith("decode vs prefill and trainer vs sampler, step ")]
    assert named and all(int(label.split()[-3]) <= int(label.split()[-1]) for label in named), labels
