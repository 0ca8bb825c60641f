"""One line at the bottom: model, device, dtype, progress of the run, last run time."""

from __future__ import annotations

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
        parts = (self._setup, self._activity, self._last_run, self._skipped)
        self.update(Text(" · ".join(part for part in parts if part)))
