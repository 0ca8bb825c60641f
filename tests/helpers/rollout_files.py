"""Rollouts files for the tests: sequences sampled by the built-in model itself (transformers' `generate`, batched,
temperature 1, a fixed seed), each with the logprobs its sampling step gave the chosen token, written as
`batchtui rollouts` reads them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core.models.builtin import builtin_path

METRICS = ("max_abs_diff", "mean_abs_diff", "ratio_min", "ratio_max", "kl", "k3_kl", "chi2_token", "chi2_seq",
           "training_ppl", "rollout_ppl", "log_ppl_diff", "clip_fraction", "tis_fraction", "ppl_ratio",
           "masked_token_fraction", "masked_seq_fraction", "seq_ratio_min", "seq_ratio_mean", "seq_ratio_max",
           "ess_token", "ess_seq")  # fmt: skip
PROMPTS = ["a", "The quick brown fox", "def f(x):\n    return x + 1", "Once upon a time", "1, 2, 3,", "Hello"]


def sampled_rollouts(
    model_name: str, count: int, new_tokens: int = 8, seed: int = 0, batch: int = 4, model=None
) -> list[dict]:
    """`count` rollouts of the built-in `model_name` (float32, or `model` as it is): prompts cycled from PROMPTS,
    sampled `batch` at a time (left-padded); each with its prompt and completion ids, the sampler's logprobs and
    top-1 ids."""
    path = builtin_path(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    rollouts = []
    for start in range(0, count, batch):
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(start, min(count, start + batch))]
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        # the model's own logits (as a server reports logprobs), before `min_new_tokens` masks the end token
        scores = torch.stack(out.logits, 1).float().log_softmax(-1)  # [rows, steps, V]
        chosen = out.sequences[:, inputs.input_ids.shape[1] :]
        for row, prompt in enumerate(prompts):
            rollouts.append(
                {
                    "prompt_ids": tokenizer(prompt).input_ids,
                    "completion_ids": chosen[row].tolist(),
                    "logprobs": scores[row].gather(-1, chosen[row][:, None])[:, 0].tolist(),
                    "top1_ids": scores[row].argmax(-1).tolist(),
                    "id": f"rollout-{start + row}",
                }
            )
    return rollouts


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def metrics_by_definition(
    pairs: list[tuple[list[float], list[float]]], clip_eps: float = 0.2, tis_cap: float = 2.0, tis_floor: float = 0.0
) -> dict:
    """The definitions (the issues' and docs/metrics.md's words), in float64, from each sequence's (trainer, sampler)
    logprobs."""
    lt = [t for trainer, _ in pairs for t in trainer]
    lr = [s for _, sampler in pairs for s in sampler]
    delta = [t - s for t, s in zip(lt, lr)]
    ratio = [math.exp(d) for d in delta]
    n, seqs = len(delta), len(pairs)
    seq_ratio = [math.exp(math.fsum(t - s for t, s in zip(*p))) for p in pairs]
    return {
        "ppl_ratio": math.fsum(math.exp(math.fsum(s) / len(s) - math.fsum(t) / len(t)) for t, s in pairs) / seqs,
        "masked_token_fraction": sum(not tis_floor <= r <= tis_cap for r in ratio) / n,
        "masked_seq_fraction": sum(not tis_floor <= r <= tis_cap for r in seq_ratio) / seqs,
        "tis_low_fraction": sum(r < tis_floor for r in ratio) / n,
        "seq_ratio_min": min(seq_ratio),
        "seq_ratio_mean": math.fsum(seq_ratio) / seqs,
        "seq_ratio_max": max(seq_ratio),
        "ess_token": math.fsum(ratio) ** 2 / (n * math.fsum(r * r for r in ratio)),
        "ess_seq": math.fsum(seq_ratio) ** 2 / (seqs * math.fsum(r * r for r in seq_ratio)),
        "max_abs_diff": max(map(abs, delta)),
        "mean_abs_diff": math.fsum(map(abs, delta)) / n,
        "ratio_min": min(ratio),
        "ratio_max": max(ratio),
        "kl": math.fsum(s - t for t, s in zip(lt, lr)) / n,
        "k3_kl": math.fsum(r - 1 - d for r, d in zip(ratio, delta)) / n,
        "chi2_token": math.fsum(r * r for r in ratio) / n - 1,
        "chi2_seq": math.fsum(math.exp(2 * math.fsum(t - s for t, s in zip(*p))) for p in pairs) / seqs - 1,
        "training_ppl": math.fsum(math.exp(-math.fsum(t) / len(t)) for t, _ in pairs) / seqs,
        "rollout_ppl": math.fsum(math.exp(-math.fsum(s) / len(s)) for _, s in pairs) / seqs,
        "log_ppl_diff": math.fsum(math.fsum(s) / len(s) - math.fsum(t) / len(t) for t, s in pairs) / seqs,
        "clip_fraction": sum(abs(r - 1) > clip_eps for r in ratio) / n,
        "tis_fraction": sum(r > tis_cap for r in ratio) / n,
    }


def own_logprobs(model, row: dict, temperature: float = 1.0) -> list[float]:
    """This test's own trainer: the sequence alone, one forward, log_softmax in float32 at the chosen tokens (of the
    logits divided by `temperature`)."""
    ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
    p = len(row["prompt_ids"])
    logits = model(input_ids=ids).logits[0, p - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(row["completion_ids"])[:, None])[:, 0].tolist()


def records_in(path: Path) -> list[dict]:
    """A records file's records, after its first line (the settings of the run that wrote them), which is checked."""
    lines = path.read_text().splitlines()
    assert not lines or json.loads(lines[0])["records_of"] == "batchtui rollouts", lines[:1]
    return [json.loads(line) for line in lines[1:]]
