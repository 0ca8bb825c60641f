"""Which of TRL's two ways of calling the model parts its logprobs from the sampler's (`--trainer trl`).

TRL's GRPO trainer calls the model without position ids (a left-padded row's positions then start at its padding, so
they depend on the other rows) and scores through its fused LM head (each label's logprob by an online log-sum-exp
over vocabulary tiles, not log_softmax of the logits). Each part is measured alone, on the same tokens: the tokens
whose logprob moves when position ids counted from the mask are given to TRL's call (the positions' part), and, with
those position ids, the tokens whose logprob moves between TRL's fused head and log_softmax of the float32 logits (the
head's part). A token counts where the two are not the same bits; |Δ| is the largest move.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TrlParts:
    tokens: int
    by_positions: int  # tokens whose logprob the missing position ids move
    max_by_positions: float
    by_head: int  # tokens whose logprob TRL's fused head moves (position ids given)
    max_by_head: float


def trl_parts(as_trl: Iterable[float], with_positions: Iterable[float], from_logits: Iterable[float]) -> TrlParts:
    """The parts over tokens given three ways: TRL's call, TRL's call with position ids, the logits' log_softmax
    with position ids."""
    tokens = by_positions = by_head = 0
    max_by_positions = max_by_head = 0.0
    for trl, given, logits in zip(as_trl, with_positions, from_logits, strict=True):
        tokens += 1
        if trl != given:
            by_positions += 1
            max_by_positions = max(max_by_positions, abs(trl - given))
        if given != logits:
            by_head += 1
            max_by_head = max(max_by_head, abs(given - logits))
    return TrlParts(tokens, by_positions, max_by_positions, by_head, max_by_head)


def summed(parts: Iterable[TrlParts]) -> TrlParts | None:
    """The parts of several batches as one (None for none)."""
    total = None
    for p in parts:
        total = (
            p
            if total is None
            else TrlParts(
                total.tokens + p.tokens,
                total.by_positions + p.by_positions,
                max(total.max_by_positions, p.max_by_positions),
                total.by_head + p.by_head,
                max(total.max_by_head, p.max_by_head),
            )
        )
    return total
