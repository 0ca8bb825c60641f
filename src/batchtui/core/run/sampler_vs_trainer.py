"""Sampler vs trainer for one chunk of a generation: the batched decode's logprobs of the tokens it chose against the
trainer's forward of the chunk's prompts + continuations (`trainer_forward`), and where the two part.

Where a text's logprobs differ, the first module (in run order) whose output for the first differing token is not
the same bits in the two: the sampler's side is the chunk's greedy decode run again with hooks (its pass `step`, the
prefill being pass 0, at the row's last position), the trainer's side its forward run again with hooks (at the
position before the token). Both runs repeat the very computation measured, so their outputs are its own. With
`ops`, inside that module, the first aten op whose inputs for the token are the same bits in the two and whose output
is not (`run.first_op`, as `check --ops` finds it between a text alone and batched).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.loading import LoadedModel
from ..numbers.comparison import FirstOp
from ..numbers.importance import SequenceLogprobs
from .backend import Decoded
from .first_op import OnePlace, first_op_between
from .module_outputs import first_differing, module_outputs
from .trainer_forward import DEFAULT, TrainerCall, score_as_trainer


def logprobs_of(
    loaded: LoadedModel,
    prompts: list[list[int]],
    completions: list[list[int]],
    batched: Decoded,
    call: TrainerCall = DEFAULT,
) -> list[SequenceLogprobs]:
    """Each row's continuation (`completions`: the batched decode's tokens up to its EOS) scored by the sampler (its
    step logits, log_softmax in float32) and by the trainer called as `call` says, and where their top-1s part (not
    known through TRL's head: it gives no logits)."""
    scores = score_as_trainer(loaded.model, prompts, completions, loaded.pad_token_id, call)
    sequences = []
    for row, (completion, scored) in enumerate(zip(completions, scores)):
        stepped = batched.kept_logits[row, : len(completion)].float().to(scored.logprobs.device)
        chosen = torch.tensor(completion, device=stepped.device)
        sampler = stepped.log_softmax(-1).gather(-1, chosen[:, None])[:, 0]
        disagree = None if scored.top1 is None else tuple((stepped.argmax(-1) != scored.top1).tolist())
        trainer = tuple(scored.logprobs.tolist())
        sequences.append(SequenceLogprobs(trainer, tuple(sampler.tolist()), disagree))
    return sequences


def first_parting_places(
    loaded: LoadedModel,
    decode: Callable[[], object],
    prompts: list[list[int]],
    completions: list[list[int]],
    steps: dict[int, int],
    ops: bool = False,
    call: TrainerCall = DEFAULT,
) -> dict[int, tuple[str | None, FirstOp | None]]:
    """For each row of `steps` (row -> its first differing completion token), the first module whose output there
    differs between the sampler (`decode()` runs the chunk's greedy decode again) and the trainer's forward, and with
    `ops` the first op inside it that makes them part (None where none is found)."""
    if not steps:
        return {}
    head = loaded.model.get_output_embeddings()
    # the recorded modules in run order, then the head (`generate` computes its logits for the last position alone)
    order = [m.name for m in loaded.structure.recorded(modules=True)]
    order += [name for name, module in loaded.model.named_modules() if module is head and head is not None]

    def train():
        return score_as_trainer(loaded.model, prompts, completions, loaded.pad_token_id, call)

    start, batch = max(len(p) for p in prompts), len(prompts)
    sampler = module_outputs(loaded.model, order, decode, {row: (step, row, -1) for row, step in steps.items()})
    at_token = {row: (0, row, start - 1 + step) for row, step in steps.items()}
    trainer = module_outputs(loaded.model, order, train, at_token)
    found = {}
    for row, step in steps.items():
        module = first_differing(order, sampler.get(row, {}), trainer.get(row, {}))
        op = None
        if ops and module is not None:
            length = start + max(len(c) for c in completions)
            decoded = OnePlace(decode, step, batch, start if step == 0 else 1, row, -1)
            op = first_op_between(
                loaded, module, decoded, OnePlace(train, 0, batch, length, row, start - 1 + step), _SIDES
            )
        found[row] = (module, op)
    return found


_SIDES = ("in the sampler's decode", "in the trainer's forward")
