"""One line at the bottom: model, device, dtype, the running pass and its elapsed time, the last run's
time, and the last error until a run succeeds."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from ..core.visible import literal


class StatusLine(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._setup = ""
        self._activity = "starting…"
        self._last_run = ""
        self._skipped = ""
        self._error = ""
        self._run_started: float | None = None  # while a run is in flight: its elapsed time ticks

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

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
        self._error = literal(message.splitlines()[0] if message else "", 120)
        self._render_line()

    def clear_error(self) -> None:
        self._error = ""
        self._render_line()

    def set_setup(self, model: str, device: str, dtype: str, trust_remote_code: bool) -> None:
        self._setup = f"{literal(model, 40)} · {device} · {dtype}" + (
            " · TRUST REMOTE CODE ON" if trust_remote_code else ""
        )
        self._render_line()

    def set_activity(self, activity: str) -> None:
        self._activity = activity
        self._render_line()

    def set_last_run(self, seconds: float) -> None:
        self._last_run = f"last run {seconds:.2f} s"
        self._render_line()

    def set_skipped(self, blank_lines: int) -> None:
        self._skipped = f"{blank_lines} blank line{'s' if blank_lines != 1 else ''} skipped" if blank_lines else ""
        self._render_line()

    def _render_line(self) -> None:
        activity = self._activity
        if self._run_started is not None:
            activity += f" · {time.monotonic() - self._run_started:.0f} s"
        parts = (self._setup, activity, self._last_run, self._skipped)
        line = Text(" · ".join(part for part in parts if part))
        if self._error:
            line.append(f" · last run failed: {self._error}", style="bold red")
        self.update(line)
