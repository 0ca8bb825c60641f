"""Rollouts files for the tests: sequences sampled by the built-in model itself (transformers' `generate`, batched,
temperature 1, a fixed seed), each with the logprobs its sampling step gave the chosen token, written as
`batchtui rollouts` reads them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core.models.builtin import builtin_path

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
