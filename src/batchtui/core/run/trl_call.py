"""The trainer's loss forward as TRL's GRPO trainer calls the model (`--trainer trl`).

TRL's `GRPOTrainer` (1.16: `_get_per_token_logps_and_entropies`) passes the input ids and the attention mask, no
position ids, and labels that leave out everything before the completions; its model carries TRL's fused LM head
(`add_fused_lm_head`), whose forward returns each label's logprob computed in vocabulary tiles (an online
log-sum-exp: no logits held), divided by the trainer's temperature. The head is TRL's own code, added for the call and
taken off after, so the logprobs are TRL's to the bit (in the batch-invariant mode, the mode's stand-in for its kernel,
`invariant.fused_heads`, and its positions counted from the mask, `invariant.positions`, are what TRL gets too).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    import torch

COVERED = ("1.16",)  # the TRL versions whose call this is (the test extras pin one)


def check_trl() -> None:
    """One line (exit 2) unless a TRL whose call this reproduces is installed; read from its metadata, before torch
    loads."""
    try:
        version = metadata.version("trl")
    except metadata.PackageNotFoundError:
        raise InputError(
            f"--trainer trl scores with TRL's own fused LM head: install TRL (pip install 'trl=={COVERED[-1]}.*')"
        ) from None
    if ".".join(version.split(".")[:2]) not in COVERED:
        raise InputError(
            f"--trainer trl reproduces TRL {', '.join(COVERED)}'s call of the model, not TRL {version}'s: install "
            f"TRL {COVERED[-1]} (pip install 'trl=={COVERED[-1]}.*') to score as it does"
        )


@functools.cache  # (once a process: every scored batch adds TRL's head again)
def trl_utils():
    """TRL's `trl.trainer.utils`, imported and its version checked. Imported before the batch-invariant mode is
    entered, so that the mode finds TRL's fused head there and computes it the sampler's way (`fused_heads`)."""
    check_trl()
    from trl.trainer import utils

    return utils


@contextlib.contextmanager
def _fused_head(model: torch.nn.Module, temperature: float) -> Iterator[None]:
    """`model` with TRL's fused LM head inside the block (TRL sets it as the instance's `forward`), as it was after."""
    own = vars(model).get("forward")  # the instance's own forward, where something set one
    trl_utils().add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    try:
        yield
    finally:
        if own is None:
            vars(model).pop("forward", None)
        else:
            vars(model)["forward"] = own


def trl_logprobs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    width: int,
    temperature: float,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([b, width] logprobs, [b, width] entropies) of the last `width` tokens of each row (the completions,
    right-padded; a padded place's 0) from one call of `model` as TRL makes it: `ids` and `mask` alone, or with
    `positions` (how this tool tells the missing position ids' part from the head's)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-width] = -100  # only the completions are scored
    given = {} if positions is None else {"position_ids": positions}
    with _fused_head(model, temperature):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, **given)
    return out.log_probs[:, -width:].detach(), out.entropy[:, -width:].detach()
