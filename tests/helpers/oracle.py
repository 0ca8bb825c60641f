"""The seed's own method, written with plain transformers calls: the engine's independent check."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass
class OracleText:
    token_ids: list[int]
    max_abs_diff: float
    allclose: bool
    batched: torch.Tensor  # this text's real rows of the batched logits, model dtype
    single: torch.Tensor


def seed_compare(
    path, texts, dtype, padding_side, positions="mask", atol=1e-5, rtol=1e-3, attn=None
) -> list[OracleText]:
    """All texts in one padded batch (as the seed does), each text also alone; `attn`: the attention the engine was
    given (None: the model's default, which differs between transformers releases for some architectures)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = padding_side
    chosen = {} if attn is None else {"attn_implementation": attn}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **chosen).eval()
    embed = model.get_input_embeddings()
    results = []
    with torch.no_grad():
        inputs = tokenizer(texts, return_tensors="pt", padding=True)
        mask = inputs.attention_mask
        if positions == "arange":
            position_ids = torch.arange(mask.shape[1]).unsqueeze(0).expand(mask.shape[0], -1)
        else:
            position_ids = torch.clamp(mask.cumsum(-1) - 1, min=0)
            position_ids[mask == 0] = 1
        batch_logits = model(
            inputs_embeds=embed(inputs.input_ids), attention_mask=mask, position_ids=position_ids
        ).logits
        for i, text in enumerate(texts):
            ids = tokenizer(text, return_tensors="pt").input_ids
            n = ids.shape[1]
            single = model(
                inputs_embeds=embed(ids),
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(n).unsqueeze(0),
            ).logits[0]
            rows = torch.nonzero(mask[i]).flatten()
            batched = batch_logits[i, rows]
            results.append(
                OracleText(
                    token_ids=ids[0].tolist(),
                    max_abs_diff=(batched.float() - single.float()).abs().max().item(),
                    allclose=torch.allclose(batched, single, atol=atol, rtol=rtol),
                    batched=batched,
                    single=single,
                )
            )
    return results
