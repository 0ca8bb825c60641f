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
