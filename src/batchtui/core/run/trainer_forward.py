"""The trainer's side of sampler vs trainer: one forward of a batch of prompt + completion, as an RL trainer scores
the rollouts a sampler made.

The layout is TRL's GRPO trainer's: prompts left-padded to the longest prompt, completions right-padded to the
longest completion. The model runs in training mode with dropout off (TRL's `disable_dropout`: a dropout mask is
random, no two runs of it agree) and autograd on (the forward a trainer differentiates). How it is called is a
`TrainerCall`: by default positions from the attention mask and each completion token's logprob log_softmax in float32
of the logits before it, at the token (verl's and OpenRLHF's way); `TRL` as TRL's GRPO trainer calls it (no position
ids, its fused LM head: `run.trl_call`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..numbers.trl_parts import TrlParts, trl_parts
from .packed_layout import completion_logits
from .runner import position_ids
from .trl_call import trl_logprobs, trl_utils


@dataclass(frozen=True)
class TrainerCall:
    """How the trainer's forward calls the model."""

    position_ids: bool = True  # positions counted from each row's first real token (False: none given)
    fused_head: bool = False  # logprobs through TRL's fused LM head (False: log_softmax of the float32 logits)
    pack_width: int | None = None  # the packed layout's rows of at most this many tokens (None: the GRPO layout)


DEFAULT = TrainerCall()
TRL = TrainerCall(position_ids=False, fused_head=True)
_CALLS = {"batchtui": DEFAULT, "trl": TRL}  # `--trainer`


def trainer_call(name: str) -> TrainerCall:
    """`--trainer`'s call, ready before the mode is entered (TRL's head imported: the mode stands in for it only
    where TRL is imported when it enters)."""
    call = _CALLS[name]
    if call.fused_head:
        trl_utils()
    return call


@dataclass(frozen=True)
class TrainerScores:
    """One row's completion tokens as the trainer scored them."""

    logprobs: torch.Tensor  # [n] float32: lt of each completion token
    top1: torch.Tensor | None  # [n] the trainer's own top-1 token at each of those positions (None: TRL's head)
    entropy: torch.Tensor | None = None  # [n] float32: the trainer's distribution's entropy (nats) there, if asked


@contextlib.contextmanager
def training_without_dropout(model: torch.nn.Module) -> Iterator[None]:
    """`model` in training mode with every dropout rate at 0 inside the block (modules' `p`, and the float rates
    attention layers keep as numbers); its mode and rates as they were after."""
    was_training = model.training
    owners = [model.config, *model.modules()]
    saved = [
        (owner, name, value) for owner in owners for name, value in vars(owner).items() if _rate(owner, name, value)
    ]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, 0.0)
        model.train()
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        model.train(was_training)


@contextlib.contextmanager
def trainer_modes(model: torch.nn.Module) -> Iterator[None]:
    """What `score_as_trainer` runs in (training mode without dropout, autograd on, outside inference mode), entered
    once for `scored_in_training`'s calls."""
    with torch.inference_mode(False), torch.enable_grad(), training_without_dropout(model):
        yield


def _rate(owner, name: str, value) -> bool:
    """Whether `owner.name` is a dropout rate above 0."""
    if not isinstance(value, float) or value <= 0:
        return False
    return "dropout" in name or (name == "p" and isinstance(owner, torch.nn.Dropout))


def grpo_layout(prompts: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple:
    """(input ids, attention mask, each row's first completion position): prompts left-padded to the longest
    prompt, completions right-padded to the longest completion."""
    prompt_width = max(len(p) for p in prompts)
    completion_width = max(len(c) for c in completions)
    ids, mask = [], []
    for prompt, completion in zip(prompts, completions):
        left, right = prompt_width - len(prompt), completion_width - len(completion)
        ids.append([pad_id] * left + prompt + completion + [pad_id] * right)
        mask.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device), prompt_width


def score_as_trainer(
    model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, call: TrainerCall = DEFAULT
) -> list[TrainerScores]:
    """Each row's completion tokens scored in one training-mode forward of the batch with autograd on."""
    with trainer_modes(model):
        return scored_in_training(model, prompts, completions, pad_id, call=call)


def scored_in_training(
    model,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    temperature: float = 1.0,
    entropy: bool = False,
    call: TrainerCall = DEFAULT,
) -> list[TrainerScores]:
    """`score_as_trainer` inside its modes, entered once by a caller that scores batch after batch (entering training
    mode costs a walk over the model's modules and, where it uses hub kernels, transformers' kernelizing again).
    `entropy`: each position's entropy too (a pass over the vocabulary more; TRL's head gives it anyway)."""
    if call.fused_head:
        return _scored_through_fused_head(model, prompts, completions, pad_id, temperature, call)
    scores = []
    for before, completion in zip(_completion_logits(model, prompts, completions, pad_id, call), completions):
        before = before.float()
        if temperature != 1.0:  # log_softmax(logits / T) in float32, as TRL and verl score a sampler's tokens
            before = before / temperature
        chosen = torch.tensor(completion, device=before.device)
        every = before.log_softmax(-1)
        logprobs = every.gather(-1, chosen[:, None])[:, 0]
        # (a token of probability 0: 0 · -inf counts 0)
        spread = -(every.exp() * every).nan_to_num().sum(-1) if entropy else None
        scores.append(TrainerScores(logprobs, before.argmax(-1), spread))
    return scores


def _completion_logits(model, prompts, completions, pad_id: int, call: TrainerCall) -> list[torch.Tensor]:
    """Each completion's [n, V] logits (detached: the forward's graph goes with this call) from one forward of the
    batch in `call`'s layout."""
    # (the inputs made here: a tensor made in inference mode cannot be saved for a backward)
    with torch.inference_mode(False), torch.enable_grad():
        if call.pack_width is not None:
            befores = completion_logits(model, prompts, completions, pad_id, call.pack_width)
        else:
            logits, _, _, start = _forward_in_layout(model, prompts, completions, pad_id, call)
            # the logits at position p choose the token at p + 1: the completion's from the prompt's last position on
            befores = [logits[row, start - 1 : start - 1 + len(c)] for row, c in enumerate(completions)]
    return [before.detach() for before in befores]


def _scored_through_fused_head(model, prompts, completions, pad_id: int, temperature: float, call: TrainerCall):
    """`scored_in_training` through TRL's fused LM head, which gives each label's logprob and entropy, not the
    logits (so no top-1)."""
    with torch.inference_mode(False), torch.enable_grad():
        ids, mask, _ = grpo_layout(prompts, completions, pad_id, next(model.parameters()).device)
        width = max(len(c) for c in completions)
        positions = position_ids(mask, "mask") if call.position_ids else None
        logprobs, entropies = trl_logprobs(model, ids, mask, width, temperature, positions)
    return [
        TrainerScores(logprobs[row, : len(c)].float(), None, entropies[row, : len(c)].float())
        for row, c in enumerate(completions)
    ]


def _forward_in_layout(
    model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, call: TrainerCall = DEFAULT
) -> tuple:
    """(logits, ids, mask, the first completion position): one forward of the batch in the trainer's layout
    (`grpo_layout`), positions from the mask unless `call` gives none."""
    ids, mask, start = grpo_layout(prompts, completions, pad_id, next(model.parameters()).device)
    given = {"position_ids": position_ids(mask, "mask")} if call.position_ids else {}
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **given)
    return logits.logits, ids, mask, start


def training_step(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> float:
    """One step's forward and backward as a trainer takes it (no optimizer step): the batch in the trainer's layout,
    the loss the mean over every completion token of minus its logprob (float32 log_softmax at the token), its
    gradients computed into the parameters and dropped after. Returns the loss."""
    with trainer_modes(model):
        logits, ids, mask, start = _forward_in_layout(model, prompts, completions, pad_id)
        width = max(len(c) for c in completions)
        before = logits[:, start - 1 : start - 1 + width].float()
        chosen = ids[:, start : start + width]
        logprobs = before.log_softmax(-1).gather(-1, chosen[..., None])[..., 0]
        kept = mask[:, start : start + width].to(logprobs.dtype)  # the completions' own tokens, not their padding
        loss = -(logprobs * kept).sum() / kept.sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()


def trl_parts_of(
    model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, temperature: float = 1.0
) -> TrlParts:
    """Which of TRL's two ways (no position ids, the fused head) moves the batch's logprobs, inside the trainer's
    modes (`numbers.trl_parts`): three scorings of the batch."""

    def flat(call: TrainerCall) -> list[float]:
        scores = scored_in_training(model, prompts, completions, pad_id, temperature, call=call)
        return [value for s in scores for value in s.logprobs.tolist()]

    with_positions = TrainerCall(position_ids=True, fused_head=True)
    return trl_parts(flat(TRL), flat(with_positions), flat(DEFAULT))
