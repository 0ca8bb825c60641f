"""Two runs' logits of one text set side by side: bitwise, or how far apart (a repro pack's against a run here, two
packs' against each other)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitsMatch:
    """One run's logits here against the pack's: bitwise, or how far apart."""

    bitwise_equal: bool
    max_abs_diff: float
    flips: int  # positions whose top-1 token differs
    first_position: int | None  # the first position whose logits differ


def match_logits(ours: torch.Tensor | None, theirs: torch.Tensor | None) -> LogitsMatch | None:
    """None when either side has no logits; a shape mismatch is every position differing."""
    if ours is None or theirs is None:
        return None
    if ours.shape != theirs.shape:
        return LogitsMatch(False, math.inf, max(len(ours), len(theirs)), 0)
    equal_rows = (ours == theirs).all(dim=-1)  # NaN rows compare unequal, as they should
    if bool(equal_rows.all()):
        return LogitsMatch(True, 0.0, 0, None)
    delta = (ours.double() - theirs.double()).abs().amax().item()
    flips = int((ours.argmax(dim=-1) != theirs.argmax(dim=-1)).sum())
    first = int((~equal_rows).nonzero()[0, 0])
    return LogitsMatch(False, delta, flips, first)
