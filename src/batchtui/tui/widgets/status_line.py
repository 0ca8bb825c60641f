"""One line at the bottom, most important first: the last error (until a run succeeds), a remote-code
warning, what runs (with its elapsed time) or how the last run came out, the model, device and dtype,
then the rest. What does not fit is left out whole and the line says so; F1 shows all of it. It draws the
`RunStatus` of the explorer's state it is handed (`show`), and ticks a run's time."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from ..views.status import MORE, SEPARATOR, RunStatus, fit_status, status_parts


class StatusLine(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._status = RunStatus()

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)

    def on_resize(self) -> None:
        self._render_line()

    def _tick(self) -> None:
        if self._status.run_started is not None:
            self._render_line()

    def show(self, status: RunStatus) -> None:
        self._status = status
        self._render_line()

    def full_text(self) -> str:
        """The whole account, for the help screen: nothing the line leaves out is lost."""
        return "\n".join(part.text for part in status_parts(self._status, time.monotonic()) if part.text)

    def _render_line(self) -> None:
        width = self.content_size.width or 200  # before the first layout: everything, cut by the screen
        shown, left_out = fit_status(status_parts(self._status, time.monotonic()), width)
        styles = {"error": "bold red", "warning": "bold yellow"}
        line = Text()
        for index, part in enumerate(shown):
            if index:
                line.append(SEPARATOR)
            line.append(part.text, style=styles.get(part.kind, ""))
        if left_out:
            line.append(SEPARATOR + MORE, style="dim")
        self.update(line, layout=False)  # one line whose size its place sets (#status): nothing to lay out again
