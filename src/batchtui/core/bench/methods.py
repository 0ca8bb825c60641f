"""What `bench` times: the workload's texts and each method's passes (the floor, the seed's script, the generations'
floor, the trainer's forward and step over sampled continuations)."""

from __future__ import annotations

import random

import torch

from ..invariant.mode import invariant_if
from ..models.loading import LoadedModel
from ..run.runner import Runner
from ..run.skeleton import chunks
from ..run.trainer_forward import score_as_trainer, training_step
from ..settings import Settings

_WORDS = (
    "the model reads each token and attends to the ones before it while padding changes the shape of every "
    "matrix product so kernels differ and small rounding errors grow through the layers into the logits"
).split()


def workload(tokenizer, n_texts: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`n_texts` English-like texts of min..max tokens each (exact for the tokenizer given)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        target = rng.randint(min_tokens, max_tokens)
        words: list[str] = []
        while len(tokenizer(" ".join(words))["input_ids"]) < target:
            words += rng.choices(_WORDS, k=8)
        ids = tokenizer(" ".join(words))["input_ids"][:target]
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


def _bare_runner(loaded: LoadedModel, settings: Settings, padding_side: str | None = None) -> Runner:
    """The same passes as a comparison's, with nothing recorded: logits only."""
    return Runner(loaded, padding_side or settings.padding_side, settings.positions, record=False)


def _chunks(texts: list[str], settings: Settings):
    return chunks(texts, list(range(1, len(texts) + 1)), settings.batch_size)


def floor_passes(loaded: LoadedModel, texts: list[str], settings: Settings) -> None:
    """The passes a comparison cannot do without: one batched pass per chunk, one single pass per text."""
    runner = _bare_runner(loaded, settings)
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            del runner.batched(chunk.texts).output
        for text in texts:
            runner.single(runner.tokenize(text)[0])


def seed_script(loaded: LoadedModel, texts: list[str], settings: Settings) -> None:
    """The original report's method: each chunk batched, then each of its padded rows alone, torch.allclose."""
    runner = _bare_runner(loaded, settings)
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            batched = runner.batched(chunk.texts)
            for row in range(len(chunk.texts)):
                single = runner.padded_row(batched, row).logits[0]
                torch.allclose(batched.output.logits[row], single, atol=settings.atol, rtol=settings.rtol)


def generate_floor(loaded: LoadedModel, texts: list[str], settings: Settings, new_tokens: int) -> None:
    """What a user runs to see the two continuations: greedy generate on each left-padded chunk and on
    each text alone, nothing else."""
    runner = _bare_runner(loaded, settings, padding_side="left")
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            rows = [runner.tokenize(text)[0] for text in chunk.texts]
            runner.greedy(rows, new_tokens, with_logits=False)
            for ids in rows:
                runner.greedy([ids], new_tokens, with_logits=False)


def sampled_completions(loaded: LoadedModel, texts: list[str], settings: Settings, new_tokens: int) -> list[tuple]:
    """(prompt ids, the batched greedy continuation's ids) of each text: what a trainer scores."""
    runner = _bare_runner(loaded, settings, padding_side="left")
    pairs: list[tuple] = []
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            rows = [runner.tokenize(text)[0] for text in chunk.texts]
            pairs += zip(rows, runner.greedy(rows, new_tokens, with_logits=False).new_tokens.tolist())
    return pairs


def trainer_passes(loaded: LoadedModel, pairs: list[tuple], settings: Settings, invariant: bool) -> None:
    """The trainer's forward (`score_as_trainer`: training mode, autograd on) over every chunk of prompt +
    completion, in the mode or not."""
    with invariant_if(invariant, loaded.model):
        for start in range(0, len(pairs), settings.batch_size):
            prompts, completions = zip(*pairs[start : start + settings.batch_size])
            score_as_trainer(loaded.model, list(prompts), list(completions), loaded.pad_token_id)


def training_steps(loaded: LoadedModel, pairs: list[tuple], settings: Settings, invariant: bool) -> None:
    """A trainer's step over every chunk of prompt + completion (`training_step`: forward with autograd, a
    token-mean loss, its backward), in the mode or not."""
    with invariant_if(invariant, loaded.model):
        for start in range(0, len(pairs), settings.batch_size):
            prompts, completions = zip(*pairs[start : start + settings.batch_size])
            training_step(loaded.model, list(prompts), list(completions), loaded.pad_token_id)
