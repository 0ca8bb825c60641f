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


@dataclass(frozen=True)
class RunStatus:
    """What the app knows of its runs, for the status line (part of the explorer's state; the app its one writer)."""

    setup: str = ""  # the model, device and dtype
    trust_remote_code: bool = False
    activity: tuple[str, ...] = ("starting…",)  # what runs now, or the last run's outcome, most important first
    run_started: float | None = None  # the monotonic time a run in flight started (its elapsed time ticks)
    last_run_s: float | None = None
    blank_lines: int = 0  # skipped in the editor's texts
    error: str = ""  # the last run's failure, kept until a run succeeds
    fingerprint: str = ""  # shown on request (I)


def status_parts(status: RunStatus, now: float) -> list[StatusPart]:
    """Everything the line has to say, the most important first (`now`: the monotonic clock, for a run's time)."""
    headline, *rest = status.activity or ("",)
    if status.run_started is not None:
        headline += f" · {now - status.run_started:.0f} s"
    blank = status.blank_lines
    return [
        StatusPart(f"last run failed: {literal(status.error.splitlines()[0], 200)}" if status.error else "", "error"),
        StatusPart("TRUST REMOTE CODE ON" if status.trust_remote_code else "", "warning"),
        StatusPart(headline),
        StatusPart(status.setup),
        StatusPart(literal(status.fingerprint, 200)),
        *(StatusPart(part) for part in rest),
        StatusPart("" if status.last_run_s is None else f"last run {status.last_run_s:.2f} s"),
        StatusPart(f"{blank} blank line{'s' if blank != 1 else ''} skipped" if blank else ""),
    ]


def setup_words(model: str, device: str, dtype: str, auto: bool) -> str:
    """The model, device and dtype as the line says them: `auto` as what it resolved to, once a run loaded it."""
    shown = f"{dtype} (auto)" if auto and dtype != "auto" else dtype
    return f"{literal(model, 40)} · {device} · {shown}"


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
