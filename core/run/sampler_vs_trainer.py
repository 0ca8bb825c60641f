"""Sampler vs trainer for one chunk of a generation: the batched decode's logprobs of the tokens it chose against the
trainer's forward of the chunk's prompts + continuations (`trainer_forward`), and where the two part.

Where a text's logprobs differ, the first module (in run order) whose output for the first differing token is not
the same bits in the two: the sampler's side is the chunk's greedy decode run again with hooks (its pass `step`, the
prefill being pass 0, at the row's last position), the trainer's side its forward run again with hooks (at the
position before the token). Both runs repeat the very computation measured, so their outputs are its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.hooks import own_thread
from ..models.loading import LoadedModel
from ..numbers.importance import SequenceLogprobs
from .backend import Decoded
from .trainer_forward import score_as_trainer


def logprobs_of(
    loaded: LoadedModel, prompts: list[list[int]], completions: list[list[int]], batched: Decoded
) -> list[SequenceLogprobs]:
    """Each row's continuation (`completions`: the batched decode's tokens up to its EOS) scored by the sampler (its
    step logits, log_softmax in float32) and by the trainer, and where their top-1s part."""
    scores = score_as_trainer(loaded.model, prompts, completions, loaded.pad_token_id)
    sequences = []
    for row, (completion, scored) in enumerate(zip(completions, scores)):
        stepped = batched.logits[row, : len(completion)].float().to(scored.logprobs.device)
        chosen = torch.tensor(completion, device=stepped.device)
        sampler = stepped.log_softmax(-1).gather(-1, chosen[:, None])[:, 0]
        disagree = (stepped.argmax(-1) != scored.top1).tolist()
        trainer = tuple(scored.logprobs.tolist())
        sequences.append(SequenceLogprobs(trainer, tuple(sampler.tolist()), tuple(disagree)))
    return sequences


def first_parting_modules(
    loaded: LoadedModel,
    decode: Callable[[], object],
    prompts: list[list[int]],
    completions: list[list[int]],
    steps: dict[int, int],
) -> dict[int, str | None]:
    """For each row of `steps` (row -> its first differing completion token), the first module whose output there
    differs between the sampler (`decode()` runs the chunk's greedy decode again) and the trainer's forward."""
    if not steps:
        return {}
    head = loaded.model.get_output_embeddings()
    # the recorded modules in run order, then the head (`generate` computes its logits for the last position alone)
    order = [m.name for m in loaded.structure.recorded(modules=True)]
    order += [name for name, module in loaded.model.named_modules() if module is head and head is not None]
    sampler = _outputs(loaded.model, order, decode, {(step, row) for row, step in steps.items()})
    start = max(len(p) for p in prompts)
    at = {(0, row): (row, start - 1 + step) for row, step in steps.items()}
    trainer = _outputs(
        loaded.model,
        order,
        lambda: score_as_trainer(loaded.model, prompts, completions, loaded.pad_token_id),
        set(at),
        places=at,
    )
    found = {}
    for row, step in steps.items():
        mine, theirs = sampler.get((step, row), {}), trainer.get((0, row), {})
        found[row] = next(
            (name for name in order if name in mine and name in theirs and not torch.equal(mine[name], theirs[name])),
            None,
        )
    return found


def _outputs(model, order: list[str], run: Callable[[], object], wanted: set, places: dict | None = None) -> dict:
    """(pass, row) -> {module: its output there}: a row's last position in the run's pass `pass` (a decode's), or
    where `places` says ((pass, row) -> (row, position): one forward's)."""
    named = dict(model.named_modules())
    passes = [-1]
    kept: dict[tuple, dict[str, torch.Tensor]] = {}

    def count(module, args):
        passes[0] += 1

    def keep(name: str):
        def hook(module, args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
                return
            for pass_, row in wanted:
                if pass_ == passes[0]:
                    row_, position = places[(pass_, row)] if places else (row, -1)
                    kept.setdefault((pass_, row), {})[name] = tensor[row_, position].detach().clone()

        return hook

    handles = [model.register_forward_pre_hook(own_thread(count))]
    handles += [named[name].register_forward_hook(own_thread(keep(name))) for name in order if name in named]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return kept
