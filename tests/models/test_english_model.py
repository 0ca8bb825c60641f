"""The built-in English model: shipped in the package, loaded like any checkpoint, and good enough that its
predictions are words: held-out loss well below uniform, words after common contexts, 8192 positions."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from helpers.paths import REPOSITORY, TEST_DATA
from transformers import AutoModelForCausalLM, AutoTokenizer

import batchtui.core
from batchtui.core import Settings
from batchtui.core.models.builtin import builtin_path
from batchtui.core.models.loading import load_model
from batchtui.core.settings import DEFAULT_MODEL

NAME = "qwen2-english-4m"
HELD_OUT = TEST_DATA / "english_heldout.txt"
SCRIPT = REPOSITORY / "scripts" / "train_english_model.py"


@pytest.fixture(scope="module")
def english():
    path = builtin_path(NAME)
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_it_is_the_default_and_ships_in_the_package():
    assert DEFAULT_MODEL == NAME == Settings().model
    folder = builtin_path(NAME)
    assert Path(batchtui.core.__file__).parent in folder.parents  # package data, no download
    weights = folder / "model.safetensors"
    assert weights.stat().st_size <= 20 * 2**20
    loaded = load_model(Settings(model=NAME))
    assert loaded.dtype == "bfloat16"  # stored like Qwen2.5
    assert loaded.max_tokens >= 8192


def test_a_qwen2_with_a_subword_tokenizer_and_a_chat_template(english):
    tokenizer, model = english
    config = model.config
    assert config.model_type == "qwen2" and config.max_position_embeddings >= 8192
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}  # newer / older config
    assert rope["rope_theta"] == 1e6  # Qwen2.5's
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 10_000_000
    assert 2000 <= len(tokenizer) <= 8192
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    words = tokenizer.tokenize(" the number of arguments")
    assert len(words) <= 5  # subwords, not bytes
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_held_out_loss_is_two_nats_below_uniform(english):
    tokenizer, model = english
    ids = torch.tensor(tokenizer(HELD_OUT.read_text(encoding="utf-8"))["input_ids"])
    assert len(ids) > 5000
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, 256):
            window = ids[start : start + 257]
            logits = model(window[None, :-1]).logits[0]
            total += torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum").item()
            count += len(window) - 1
    assert total / count <= math.log(len(tokenizer)) - 2


@pytest.mark.parametrize(
    "context", ["one of", "one of the", "The value of", "the number of", "Return the", "The function"]
)
def test_it_predicts_words_after_common_contexts(english, context):
    tokenizer, model = english
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer(context)["input_ids"]])).logits[0, -1]
    word = tokenizer.decode([logits.argmax().item()]).strip()
    assert word.isalpha() and len(word) >= 2, (context, word)  # a word, not a byte or a letter


@pytest.mark.slow
def test_held_out_text_is_not_in_the_training_text():
    """Documents are held out by a hash of their text; the corpus is the standard library of the CPython
    the script ran on (3.11), so another version's documents are not the shipped ones."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the training corpus is CPython 3.11's standard library")
    spec = importlib.util.spec_from_file_location("train_english_model", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    docs = script.documents()
    held = [d for d in docs if script.held_out(d)]
    assert 0.02 < len(held) / len(docs) < 0.1
    shipped = HELD_OUT.read_text(encoding="utf-8")
    here = [d for d in held if d in shipped]
    assert len(here) > len(held) // 2
    training = "\n".join(d for d in docs if not script.held_out(d))
    assert sum(doc in training for doc in here) <= len(here) // 20  # a docstring repeated in two places at most
