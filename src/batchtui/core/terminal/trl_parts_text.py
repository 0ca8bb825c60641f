"""`--trainer trl`'s note: which of TRL's two ways of calling the model moves the logprobs (`numbers.trl_parts`)."""

from __future__ import annotations

from ..numbers.trl_parts import TrlParts
from .plain import format_float


def trl_parts_words(parts: TrlParts, scored: str) -> str:
    """One sentence; `scored`: which tokens were scored each way ("the first batch's", "the generations'")."""
    if not parts.by_positions and not parts.by_head:
        return (
            f"scored as TRL calls the model: of {scored} {parts.tokens} tokens, none moves without position ids nor "
            "through TRL's fused LM head (each the same bits as with position ids from the mask and log_softmax of "
            "the logits)"
        )
    positions = (
        f"the missing position ids move {parts.by_positions} (up to {format_float(parts.max_by_positions)}: a "
        "left-padded row's positions start at its padding, so they depend on the other rows)"
        if parts.by_positions
        else "the missing position ids move none"
    )
    head = (
        f"TRL's fused LM head moves {parts.by_head} (up to {format_float(parts.max_by_head)}) against log_softmax "
        "of the logits"
        if parts.by_head
        else "TRL's fused LM head moves none against log_softmax of the logits"
    )
    return f"scored as TRL calls the model: of {scored} {parts.tokens} tokens, {positions}; {head}"
