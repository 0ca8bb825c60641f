"""A pane that draws a chart of what it was last shown, and draws it again when resized (what fits depends on
its size)."""

from __future__ import annotations

from textual.containers import Vertical


class ChartPane(Vertical):
    PANE_TITLE = ""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = self.PANE_TITLE
        self._shown: tuple | None = None  # what `show` was last given

    def on_resize(self) -> None:
        if self._shown is not None:
            self._draw()

    def _draw(self) -> None:
        raise NotImplementedError
