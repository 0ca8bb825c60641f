"""Built-in models that need no network.

`qwen2-english-4m` (the default) is a trained checkpoint shipped as package data: a 4M-parameter Qwen2
with a byte-level BPE tokenizer, trained on English prose by scripts/train_english_model.py. The others
are seeded random Qwen2 weights over a byte-level tokenizer, written once with `save_pretrained` to a cache
folder. All are loaded with `from_pretrained`, the same path as a real checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cache_folder import cache_folder
from .token_text import bytes_to_unicode

# Bump when the recipe below changes, so stale caches are not reused.
RECIPE_VERSION = 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_1_5B_CONFIG = Path(__file__).parent.parent / "data" / "qwen2.5-1.5b-instruct.config.json"
# Trained checkpoints shipped in the package: name -> (folder, description).
TRAINED_MODELS = {
    "qwen2-english-4m": (
        Path(__file__).parent.parent / "data" / "qwen2-english-4m",
        "4-layer Qwen2 trained on English prose (CPython's manual and docstrings), 4096-token BPE, bf16",
    ),
}


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    config: dict
    seed: int = 0


def _tiny_config() -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,  # real prompts of thousands of tokens fit
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        # Wide enough init that logits span a few units, as a trained model's do.
        "initializer_range": 0.25,
        "pad_token_id": 256,
        "eos_token_id": 258,
        "torch_dtype": "bfloat16",
    }


def _qwen_shape_config() -> dict:
    return json.loads(_QWEN_1_5B_CONFIG.read_text())


BUILTIN_MODELS = {
    "tiny": BuiltinModel("tiny", "4-layer Qwen2, random weights, byte-level tokenizer", _tiny_config()),
    "tiny-qwen2.5-1.5b-shape": BuiltinModel(
        "tiny-qwen2.5-1.5b-shape",
        "random weights with the dimensions of Qwen2.5-1.5B-Instruct",
        _qwen_shape_config(),
    ),
}


def cache_root() -> Path:
    return cache_folder() / "models"


def builtin_names() -> tuple[str, ...]:
    return (*TRAINED_MODELS, *BUILTIN_MODELS)


def builtin_path(name: str) -> Path:
    """The folder holding built-in model `name`: the package's own for a trained one, else written to the
    cache on first use."""
    if name in TRAINED_MODELS:
        return TRAINED_MODELS[name][0]
    spec = BUILTIN_MODELS[name]
    folder = cache_root() / f"{name}-v{RECIPE_VERSION}"
    if not (folder / "config.json").exists():
        _write_atomically(spec, folder)
    return folder


def _write_atomically(spec: BuiltinModel, folder: Path) -> None:
    # Written beside its final place and renamed, so a killed writer never leaves half a model.
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    staging.chmod(0o755)
    try:
        _build_tokenizer(spec.config).save_pretrained(staging)
        _build_model(spec).save_pretrained(staging)
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / "config.json").exists():  # not a concurrent writer winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_model(spec: BuiltinModel):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = dict(spec.config)
    dtype = getattr(torch, config_dict.pop("torch_dtype", "float32"))
    config = AutoConfig.for_model(**config_dict)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _build_tokenizer(config: dict):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Token id == byte value; no merges, so every byte is one token.
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    # Like Qwen2.5-Instruct: pad is <|endoftext|>, eos is <|im_end|>, no BOS is added.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        model_max_length=config["max_position_embeddings"],
    )
