"""Tiny random checkpoints of many architectures, written with save_pretrained for from_pretrained.

Each shares the built-in tiny model's byte-level tokenizer, so every text tokenizes the same way.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GQA = {**SMALL, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256}
MOE = {**GQA, "num_experts_per_tok": 2}

# name -> (config class, its keyword arguments, the router's name inside a layer for MoE models)
ARCHITECTURES = {
    "llama": ("LlamaConfig", GQA, None),
    "mistral-window": ("MistralConfig", {**GQA, "sliding_window": 6}, None),
    "gpt2": ("GPT2Config", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 256}, None),
    "opt": (
        "OPTConfig",
        {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "word_embed_proj_dim": 32},
        None,
    ),
    "gemma2": ("Gemma2Config", {**GQA, "sliding_window": 6, "query_pre_attn_scalar": 8}, None),
    "phi3": (
        "Phi3Config",
        {**SMALL, "num_key_value_heads": 2, "max_position_embeddings": 256, "pad_token_id": 0},
        None,
    ),
    "qwen3": ("Qwen3Config", GQA, None),
    "mixtral": ("MixtralConfig", {**MOE, "num_local_experts": 4}, "mlp.gate"),
    # Falcon: parallel attention, its own SDPA call, and the attention output added into the MLP's in place.
    "falcon": (
        "FalconConfig",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256},
        None,
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {**MOE, "num_experts": 4, "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": []},
        "mlp.gate",
    ),
}
# Every checkpoint `build` writes: the matrix, and Mixtral with routers on the edge of a tie.
CHECKPOINTS = (*ARCHITECTURES, "mixtral-near-tie")
# Gemma2 is run with eager attention (its soft-capping is eager's).
ATTENTION = {"gemma2": "eager"}


def build(name: str, folder: Path, tiny_path: Path) -> Path:
    """Write the tiny `name` checkpoint (seeded) with the built-in tokenizer into `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    config_class, kwargs, _ = ARCHITECTURES[name.removesuffix("-near-tie")]
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), **kwargs)
    if hasattr(config, "max_position_embeddings") and "max_position_embeddings" not in kwargs:
        config.max_position_embeddings = 256
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if name.endswith("-near-tie"):
        _make_router_rows_near_ties(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_checkpoint(path, name: str, dtype):
    """(model in eval mode, tokenizer with a pad token) of a checkpoint of the matrix or a built-in, with the attention
    the matrix runs it with."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    attn = ATTENTION.get(name.removesuffix("-near-tie"))
    kwargs = {"attn_implementation": attn} if attn else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).eval(), tokenizer


def _make_router_rows_near_ties(model) -> None:
    """Experts 1 and 2 of every router score each token almost alike: a rounding difference between
    the batched and single runs is enough to swap which of them a token goes to."""
    with torch.no_grad():
        for layer in model.model.layers:
            weight = layer.mlp.gate.weight
            weight[2] = weight[1] + 1e-4 * torch.randn_like(weight[1])


@contextlib.contextmanager
def batched_runs_one_ulp_apart(model):
    """Every embedding of a batch of several rows one ulp up: a difference between the batched and the single runs
    that is the same on every machine (a kernel's rounding differs on some CPUs only, and on others not at all)."""

    def one_ulp_up(module, inputs, output):
        return torch.nextafter(output, torch.full_like(output, torch.inf)) if output.shape[0] > 1 else output

    handle = model.get_input_embeddings().register_forward_hook(one_ulp_up)
    try:
        yield
    finally:
        handle.remove()


def build_encoder(folder: Path, tiny_path: Path) -> Path:
    """A BERT checkpoint with its LM head, complete (an encoder: every position sees every other), with the
    same tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    config = transformers.BertConfig(vocab_size=len(tokenizer), **SMALL)
    torch.manual_seed(0)
    transformers.BertLMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def copy_of(path: Path, folder: Path) -> Path:
    shutil.copytree(path, folder)
    return folder


def build_seq2seq(folder: Path, tiny_path: Path) -> Path:
    """A BART encoder-decoder checkpoint: as a causal LM it lacks the decoder's embeddings and head."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    config = transformers.BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.BartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
