"""Sampler vs trainer (`generate --vs-trainer`): the metrics are their definitions, recomputed here in float64 from
the logprobs; the logprobs are the batched decode's and a training-mode forward's of the GRPO layout, recomputed here
with transformers' own calls; without the mode they differ, with it every ratio is exactly 1 and the verdict says so."""

import json
import math

import pytest
import torch
from helpers.height_kernels import height_dependent_addmm

from batchtui.core.cli import main
from batchtui.core.models.loading import load_model
from batchtui.core.numbers.importance import SequenceLogprobs, importance_metrics
from batchtui.core.run.generation_run import generate_and_compare
from batchtui.core.settings import Settings

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

TEXTS = ["a", "The quick brown fox", "def f(x):\n    return x + 1"]
NEW = 6


def test_the_metrics_are_their_definitions():
    sequences = [
        SequenceLogprobs((-1.0, -2.5, -0.1), (-1.2, -2.0, -0.1), (False, True, False)),
        SequenceLogprobs((-3.0,), (-0.5,), (True,)),
        SequenceLogprobs((-0.7, -0.2), (-0.7, -0.9)),
    ]
    lt = [t for s in sequences for t in s.trainer]
    lr = [r for s in sequences for r in s.sampler]
    delta = [t - r for t, r in zip(lt, lr)]
    ratio = [math.exp(d) for d in delta]
    n = len(delta)
    m = importance_metrics(sequences)
    assert (m.sequences, m.tokens, m.top1_disagree) == (3, 6, 2)
    expected = {
        "max_abs_diff": max(abs(d) for d in delta),
        "mean_abs_diff": sum(abs(d) for d in delta) / n,
        "ratio_min": min(ratio),
        "ratio_max": max(ratio),
        "kl": sum(r - t for t, r in zip(lt, lr)) / n,
        "k3_kl": sum(q - 1 - d for q, d in zip(ratio, delta)) / n,
        "chi2_token": sum(q * q for q in ratio) / n - 1,
        "chi2_seq": sum(math.exp(2 * sum(t - r for t, r in zip(s.trainer, s.sampler))) - 1 for s in sequences) / 3,
        "training_ppl": sum(math.exp(-sum(s.trainer) / len(s.trainer)) for s in sequences) / 3,
        "rollout_ppl": sum(math.exp(-sum(s.sampler) / len(s.sampler)) for s in sequences) / 3,
        "log_ppl_diff": sum((sum(s.sampler) - sum(s.trainer)) / len(s.trainer) for s in sequences) / 3,
        "clip_fraction": sum(abs(q - 1) > 0.2 for q in ratio) / n,
        "tis_fraction": sum(q > 2 for q in ratio) / n,
    }
    for name, value in expected.items():
        assert getattr(m, name) == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert not m.bitwise
    same = importance_metrics([SequenceLogprobs((-1.5, -0.25), (-1.5, -0.25), (False, False))])
    assert same.bitwise and same.ratio_min == same.ratio_max == 1.0
    assert all(
        getattr(same, k) == 0.0 for k in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "max_abs_diff")
    )
    assert sequences[0].first_differing_step == 0 and sequences[2].first_differing_step == 1
    with pytest.raises(ValueError):
        SequenceLogprobs((-1.0,), ())


def _independent(loaded, texts, new_tokens):
    """transformers' own calls: the batched left-padded greedy generate's step logits (the sampler), then one
    training-mode forward of prompts left-padded + completions right-padded, autograd on (the trainer)."""
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = [tokenizer(t).input_ids for t in texts]
    width = max(map(len, prompts))
    pad = loaded.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=pad)  # fmt: skip
    completions = [out.sequences[i, width:].tolist() for i in range(len(texts))]
    assert all(loaded.tokenizer.eos_token_id not in c for c in completions)  # (no row ends early here)
    sampler = torch.stack(out.logits, 1).float().log_softmax(-1)
    longest = max(map(len, completions))
    rows = [[pad] * (width - len(p)) + p + c + [pad] * (longest - len(c)) for p, c in zip(prompts, completions)]
    real = [
        [0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (longest - len(c))
        for p, c in zip(prompts, completions)
    ]
    batch, batch_mask = torch.tensor(rows), torch.tensor(real)
    model.train()
    try:
        positions = (batch_mask.cumsum(-1) - 1).masked_fill(batch_mask == 0, 1)
        logits = model(input_ids=batch, attention_mask=batch_mask, position_ids=positions).logits.detach()
    finally:
        model.eval()
    trainer = logits[:, width - 1 : width - 1 + longest].float().log_softmax(-1)
    result = []
    for i, c in enumerate(completions):
        chosen = torch.tensor(c)[:, None]
        result.append(
            (trainer[i, : len(c)].gather(-1, chosen)[:, 0].tolist(), sampler[i].gather(-1, chosen)[:, 0].tolist())
        )
    return result


def test_the_logprobs_are_the_sampler_s_and_the_trainer_s_recomputed_here():
    settings = Settings(model="qwen2-english-4m", dtype="float32")
    found = generate_and_compare(TEXTS, settings, NEW, vs_trainer=True)
    loaded = load_model(settings)
    outputs: dict[str, list[torch.Tensor]] = {}
    hooks = [
        module.register_forward_hook(lambda m, a, out, name=name: outputs.setdefault(name, []).append(
            (out[0] if isinstance(out, tuple) else out).detach().clone()))
        for name, module in loaded.model.named_modules() if name.count(".") == 3 or name == "lm_head"
    ]  # fmt: skip
    try:
        expected = _independent(loaded, TEXTS, NEW)
    finally:
        for hook in hooks:
            hook.remove()
    for text, (trainer, sampler) in zip(found.texts, expected):
        assert list(text.vs_trainer.trainer) == trainer
        assert list(text.vs_trainer.sampler) == sampler
    # Where a text parts, its first module is the first (in run order) whose output differs between this test's own
    # decode (pass `step`, the row's last position) and its trainer's forward (the position before the token).
    width = max(len(loaded.tokenizer(t).input_ids) for t in TEXTS)
    for row, text in enumerate(found.texts):
        step = text.vs_trainer.first_differing_step
        if step is None:
            assert text.vs_trainer_module is None
            continue
        parted = [
            name for name, calls in outputs.items()
            if not torch.equal(calls[step][row, -1], calls[-1][row, width - 1 + step])
        ]  # fmt: skip
        order = [*(m.name for m in loaded.structure.recorded(modules=True)), "lm_head"]
        assert text.vs_trainer_module == min(parted, key=order.index), row
    overall = found.trainer_vs_sampler
    assert overall.tokens == len(TEXTS) * NEW and not overall.bitwise  # a prefill's attention is not a decode's


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_with_the_mode_every_ratio_is_one_and_the_verdict_says_so(dtype, tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(["generate", "--model", "qwen2-english-4m", "--dtype", dtype, "--max-new-tokens", str(NEW),
                 "--vs-trainer", "--vs-prefill", "--invariant", *TEXTS, "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(report.read_text())
    summary = data["summary"]["trainer_vs_sampler"]
    assert summary["bitwise"] and summary["tokens"] == len(TEXTS) * NEW
    assert summary["ratio_min"] == summary["ratio_max"] == 1.0
    zero = ("max_abs_diff", "mean_abs_diff", "kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "clip_fraction")
    assert all(summary[k] == 0.0 for k in (*zero, "tis_fraction", "top1_disagree"))
    for entry in data["texts"]:
        assert entry["trainer_vs_sampler"]["trainer_logprobs"] == entry["trainer_vs_sampler"]["sampler_logprobs"]
        assert entry["trainer_vs_sampler"]["first_differing_step"] is None and entry["vs_prefill"]["bitwise"]
    assert f"trainer vs sampler: {len(TEXTS)} of {len(TEXTS)} texts bitwise (every ratio exactly 1" in out
    assert f"decode vs prefill (alone): {len(TEXTS)} of {len(TEXTS)} texts bitwise" in out


def test_without_the_mode_the_verdict_gives_the_metrics(capsys):
    code = main(["generate", "--model", "qwen2-english-4m", "--dtype", "float32", "--max-new-tokens", str(NEW),
                 "--vs-trainer", *TEXTS])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0  # the continuations are the same; the logprobs are not
    assert "trainer vs sampler: 0 of 3 texts bitwise, max|δ| " in out and "; earliest at step 0 (text " in out
    assert "trainer vs sampler" in out.splitlines()[out.splitlines().index("") + 1]  # the per-text table
    # where the earliest parting starts: a module of the model (which one is the machine's kernels' to say: the
    # head's call on most, the attention's on others)
    from batchtui.core.models.loading import load_model
    from batchtui.core.settings import Settings

    named = dict(load_model(Settings(model="qwen2-english-4m", dtype="float32")).model.named_modules())
    module = out.splitlines()[-1].rsplit(" in ", 1)[1]
    assert module in named and module != "", module


def test_the_verdicts_name_the_earliest_step_any_text_parts_at():
    """Not the first text's: here text 1 parts from step 1 in both checks, text 3 from step 0."""
    import dataclasses

    from batchtui.core.numbers.generation_result import DecodeVsPrefill
    from batchtui.core.terminal.generation_text import generation_verdict

    found = generate_and_compare(TEXTS, Settings(model="tiny", dtype="float32"), 3, vs_prefill=True, vs_trainer=True)
    made = {0: ((0.0, 1e-6, 0.0), (-1.0, -2.5, -3.5)), 1: ((0.0, 0.0, 0.0), (-1.0, -1.0, -1.0)),
            2: ((1e-6, 0.0, 0.0), (-1.5, -2.0, -3.0))}  # fmt: skip
    # (text 1's trainer logprobs part at step 1, text 3's at step 0)
    texts = []
    for i, t in enumerate(found.texts):
        prefill, trainer = made[i]
        sampler = (-1.0, -2.0, -3.0) if i != 1 else (-1.0, -1.0, -1.0)
        measured = {"vs_prefill": DecodeVsPrefill(prefill), "vs_trainer": SequenceLogprobs(trainer, sampler)}
        texts.append(dataclasses.replace(t, **measured))
        texts[-1] = dataclasses.replace(texts[-1], vs_trainer_module=None)
    verdict = generation_verdict(dataclasses.replace(found, texts=tuple(texts)))
    assert "decode vs prefill (alone): 1 of 3 texts bitwise, text 3 first differs at step 0" in verdict
    assert "trainer vs sampler: 1 of 3 texts bitwise" in verdict and verdict.endswith("earliest at step 0 (text 3)")


def test_ops_name_the_first_op_where_the_sampler_and_the_trainer_part(tmp_path, capsys):
    """The cause made here: an addmm that shifts every output of a call of 8 rows or more by 2**-10 (float64, where the
    CPU's kernels keep rows; a shift the float32 logprobs show). A decoding step's call holds one row per text (3), the
    trainer's 3 x its width: the first module is the first layer's attention and its first op the query projection's
    addmm, 3 rows against all."""
    report = tmp_path / "r.json"
    with height_dependent_addmm(shift=2**-10):
        code = main(["generate", "--model", "tiny", "--dtype", "float64", "--max-new-tokens", "3", "--vs-trainer",
                     "--ops", *TEXTS, "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(report.read_text())
    for entry in data["texts"]:
        parted = entry["trainer_vs_sampler"]
        assert parted["first_differing_step"] == 1  # the prefill's calls are 8 rows or more in both
        assert parted["first_module"] == "model.layers.0.self_attn"
        op = parted["first_op"]
        assert op["op"] == "aten.addmm" and op["module"] == "model.layers.0.self_attn.q_proj"
        width = max(e["prompt_tokens"] for e in data["texts"]) + 3
        assert op["shape_sampler"][1][0] == len(TEXTS) and op["shape_trainer"][1][0] == len(TEXTS) * width
        assert op["kernel_class"] == "matmul" and op["max_abs_diff"] > 0
        assert op["cause"].startswith(f"a {len(TEXTS)}-row call in the sampler's decode, {len(TEXTS) * width} rows")
    assert "first at aten.addmm in model.layers.0.self_attn.q_proj" in out.splitlines()[-1]


def test_ops_needs_vs_trainer(capsys):
    assert main(["generate", "--model", "tiny", "--ops", "a"]) == 2
    assert "--ops names where the sampler and the trainer part: it needs --vs-trainer" in capsys.readouterr().err
