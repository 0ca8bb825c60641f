"""The status line's account, most important first, fitted to the terminal's width.

A part that does not fit is left out whole (never half a number), and the line then ends with a marker that
says where the rest is; the first part alone is cut with an ellipsis when even it does not fit."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.visible import columns, literal

SEPARATOR = " · "
MORE = "… F1: all"  # what ends a line that left parts out


@dataclass(frozen=True)
class StatusPart:
    text: str
    kind: str = "info"  # "error", "warning" or "info": how the line draws it


def fit_status(parts: list[StatusPart], width: int) -> tuple[list[StatusPart], int]:
    """The parts that fit `width` columns, in the order given (the most important first), and how many
    were left out; with any left out, room is kept for the MORE marker."""
    parts = [part for part in parts if part.text]
    if not parts:
        return [], 0
    if sum(columns(p.text) for p in parts) + columns(SEPARATOR) * max(len(parts) - 1, 0) <= width:
        return parts, 0
    room = width - columns(SEPARATOR + MORE)
    first, *rest = parts
    # The first part is always shown (cut with an ellipsis where even it does not fit); each later one
    # only whole, where it fits after those kept.
    shown = [first if columns(first.text) <= room else StatusPart(literal(first.text, max(room, 1)), first.kind)]
    used = columns(shown[0].text)
    for part in rest:
        cost = columns(SEPARATOR) + columns(part.text)
        if used + cost <= room:
            shown.append(part)
            used += cost
    return shown, len(parts) - len(shown)
