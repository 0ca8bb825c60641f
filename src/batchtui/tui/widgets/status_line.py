"""One line at the bottom, most important first: the last error (until a run succeeds), a remote-code
warning, what runs (with its elapsed time) or how the last run came out, the model, device and dtype,
then the rest. What does not fit is left out whole and the line says so; F1 shows all of it."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from ...core.visible import literal
from ..views.status import MORE, SEPARATOR, StatusPart, fit_status


class StatusLine(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._setup = ""
        self._trust = ""
        self._activity: list[str] = ["starting…"]
        self._last_run = ""
        self._skipped = ""
        self._error = ""
        self._fingerprint = ""  # shown on request (I)
        self._run_started: float | None = None  # while a run is in flight: its elapsed time ticks

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

    def on_resize(self) -> None:
        self._render_line()

    def _tick(self) -> None:
        if self._run_started is not None:
            self._render_line()

    def start_run(self) -> None:
        self._run_started = time.monotonic()
        self._render_line()

    def end_run(self) -> None:
        self._run_started = None
        self._render_line()

    def set_error(self, message: str) -> None:
        """Kept on screen until `clear_error` (the next run that succeeds)."""
        self._error = literal(message.splitlines()[0] if message else "", 200)
        self._render_line()

    def clear_error(self) -> None:
        self._error = ""
        self._render_line()

    def set_setup(self, model: str, device: str, dtype: str, trust_remote_code: bool) -> None:
        self._setup = f"{literal(model, 40)} · {device} · {dtype}"
        self._trust = "TRUST REMOTE CODE ON" if trust_remote_code else ""
        self._render_line()

    def set_activity(self, activity: str | list[str]) -> None:
        """What runs now, or the last run's outcome as parts, the most important first."""
        self._activity = [activity] if isinstance(activity, str) else list(activity)
        self._render_line()

    def set_last_run(self, seconds: float) -> None:
        self._last_run = f"last run {seconds:.2f} s"
        self._render_line()

    def set_fingerprint(self, summary: str) -> None:
        self._fingerprint = literal(summary, 200)
        self._render_line()

    def set_skipped(self, blank_lines: int) -> None:
        self._skipped = f"{blank_lines} blank line{'s' if blank_lines != 1 else ''} skipped" if blank_lines else ""
        self._render_line()

    def parts(self) -> list[StatusPart]:
        """Everything the line has to say, the most important first."""
        headline, *rest = self._activity or [""]
        if self._run_started is not None:
            headline += f" · {time.monotonic() - self._run_started:.0f} s"
        return [
            StatusPart(f"last run failed: {self._error}" if self._error else "", "error"),
            StatusPart(self._trust, "warning"),
            StatusPart(headline),
            StatusPart(self._setup),
            StatusPart(self._fingerprint),
            *(StatusPart(part) for part in rest),
            StatusPart(self._last_run),
            StatusPart(self._skipped),
        ]

    def full_text(self) -> str:
        """The whole account, for the help screen: nothing the line leaves out is lost."""
        return "\n".join(part.text for part in self.parts() if part.text)

    def _render_line(self) -> None:
        width = self.content_size.width or 200  # before the first layout: everything, cut by the screen
        shown, left_out = fit_status(self.parts(), width)
        styles = {"error": "bold red", "warning": "bold yellow"}
        line = Text()
        for index, part in enumerate(shown):
            if index:
                line.append(SEPARATOR)
            line.append(part.text, style=styles.get(part.kind, ""))
        if left_out:
            line.append(SEPARATOR + MORE, style="dim")
        self.update(line, layout=False)  # one line whose size its place sets (#status): nothing to lay out again
