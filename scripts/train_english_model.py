"""Train the built-in English model: a small Qwen2 causal LM with a byte-level BPE tokenizer.

    python scripts/train_english_model.py [--steps 1400] [--out src/batchtui/core/data/qwen2-english-4m]

The text is English prose that ships with every CPython: the reference manual's topics
(`pydoc_data.topics`) and the docstrings of the standard library's modules, classes and functions
(doctest lines and code left out). It is under the PSF License Version 2, which allows a derivative
work to be redistributed with its notice (README.md says so). One document in twenty (chosen by a hash of
its text) is held out and written to tests/data/english_heldout.txt: the model never trains on it.

Seeded throughout; the same CPython version gives the same corpus, tokenizer and weights. About 35
minutes on 2 CPU cores. Prints the held-out loss against ln(vocab) and what it predicts after a few
common contexts.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import math
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
NAME = "qwen2-english-4m"
HELD_OUT = ROOT / "tests" / "data" / "english_heldout.txt"
VOCAB = 4096
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5's chat template, without its tool-calling branches.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,  # Qwen2.5's rope: long prompts fit
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
CONTEXTS = ("one of the", "The value of", "This is a", "If the", "It is", "the number of")
_SKIPPED_DIRS = ("test", "tests", "idle_test", "site-packages", "__pycache__")


def documents() -> list[str]:
    """The reference manual's topics, then every stdlib docstring of 80+ characters, prose only."""
    import pydoc_data.topics

    texts = [pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if any(part in _SKIPPED_DIRS or part.startswith("test") for part in path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 80:
                    texts.append(doc)
    return [doc for doc in map(_prose, texts) if len(doc) >= 80]


def _prose(text: str) -> str:
    """Doctest and indented code lines dropped; each paragraph's wrapped lines joined into one line, so
    that a line break is a paragraph's end and not a column limit."""
    lines = [line.rstrip() for line in text.splitlines() if not line.lstrip().startswith((">>>", "..."))]
    lines = [line for line in lines if not line.startswith("   ")]
    paragraphs = re.split(r"\n\s*\n", "\n".join(lines))
    return "\n\n".join(" ".join(part.split()) for part in paragraphs if part.strip())


def held_out(doc: str) -> bool:
    return int(hashlib.sha1(doc.encode()).hexdigest(), 16) % 20 == 0


def train_tokenizer(docs: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(docs, trainer=trainer)
    # Like Qwen2.5-Instruct: pad is <|endoftext|>, eos is <|im_end|>, no BOS is added.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        model_max_length=CONFIG["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )


def token_stream(tokenizer, docs: list[str]) -> torch.Tensor:
    """Every document's tokens, each followed by <|endoftext|>, as one stream."""
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for doc in docs:
        ids += tokenizer(doc)["input_ids"] + [end]
    return torch.tensor(ids)


def build_model(tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **CONFIG,
    )
    return Qwen2ForCausalLM(config)


def mean_loss(model, stream: torch.Tensor, length: int = 256) -> float:
    """Mean next-token loss over the stream, in windows of `length` tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(stream) - 1, length):
            window = stream[start : start + length + 1]
            if len(window) < 2:
                break
            logits = model(window[None, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], window[1:], reduction="sum")
            total, count = total + loss.item(), count + len(window) - 1
    return total / count


def train(model, stream: torch.Tensor, steps: int, batch: int, length: int, lr: float) -> None:
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(steps // 20, 1)

    def schedule(step: int) -> float:  # linear warm-up, then cosine down to a tenth
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    started = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - length - 1, (batch,), generator=generator)
        windows = torch.stack([stream[s : s + length + 1] for s in starts.tolist()])
        logits = model(windows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - started
            print(f"step {step}/{steps} loss {loss.item():.3f} · {elapsed / 60:.1f} min", flush=True)
    model.eval()


def predictions(model, tokenizer) -> list[tuple[str, str]]:
    shown = []
    with torch.no_grad():
        for context in CONTEXTS:
            ids = torch.tensor([tokenizer(context)["input_ids"]])
            top = model(ids).logits[0, -1].float().argmax().item()
            shown.append((context, tokenizer.decode([top])))
    return shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "src" / "batchtui" / "core" / "data" / NAME)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    docs = documents()
    train_docs = [d for d in docs if not held_out(d)]
    test_docs = [d for d in docs if held_out(d)]
    print(
        f"python {sys.version.split()[0]} · {len(train_docs)} training documents "
        f"({sum(map(len, train_docs))} chars), {len(test_docs)} held out",
        flush=True,
    )
    HELD_OUT.parent.mkdir(parents=True, exist_ok=True)
    HELD_OUT.write_text("\n\n".join(test_docs) + "\n", encoding="utf-8")
    tokenizer = train_tokenizer(train_docs)
    stream = token_stream(tokenizer, train_docs)
    model = build_model(tokenizer)
    params = sum(p.numel() for p in model.parameters())
    print(f"vocabulary {len(tokenizer)} · {len(stream)} training tokens · {params / 1e6:.2f}M parameters", flush=True)
    train(model, stream, args.steps, args.batch, args.length, args.lr)
    model = model.to(torch.bfloat16)  # stored like Qwen2.5, in bf16
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    evaluated = model.float()
    held = token_stream(tokenizer, test_docs)
    loss = mean_loss(evaluated, held)
    print(
        f"held-out loss {loss:.3f} nats over {len(held)} tokens; uniform ln({len(tokenizer)}) = "
        f"{math.log(len(tokenizer)):.3f}; {math.log(len(tokenizer)) - loss:.2f} nats below",
        flush=True,
    )
    for context, word in predictions(evaluated, tokenizer):
        print(f"  {context!r} -> {word!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
