"""Broken checkpoints for bad-input tests, made from the built-in model with plain transformers calls."""

from __future__ import annotations

import shutil
from pathlib import Path


def not_a_causal_lm(folder: Path) -> Path:
    from transformers import BertConfig

    BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    ).save_pretrained(folder)
    return folder


def tokenizer_without_pad_or_eos(tiny_path: Path, folder: Path) -> Path:
    from transformers import AutoTokenizer

    shutil.copytree(tiny_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    tokenizer.save_pretrained(folder)
    return folder


def embedding_shorter_than_tokenizer(tiny_path: Path, folder: Path) -> Path:
    """The built-in model cut to 100 embedding rows while its tokenizer keeps its 259 tokens."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    model.config.pad_token_id = model.config.eos_token_id = None  # (ids past the rows: transformers refuses them)
    model.resize_token_embeddings(100)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 100
    return folder
