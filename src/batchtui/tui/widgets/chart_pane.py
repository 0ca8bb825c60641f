"""A pane that draws a chart of what it was last shown, and draws it again when resized (what fits depends on
its size)."""

from __future__ import annotations

from textual.containers import Vertical
from textual.widgets import Static


class ChartPane(Vertical):
    PANE_TITLE = ""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = self.PANE_TITLE
        self._shown: tuple | None = None  # what `show` was last given
        self._captions: dict[str, object] = {}  # widget id -> the content last given to it

    def on_resize(self) -> None:
        if self._shown is not None:
            self._draw()

    def _draw(self) -> None:
        raise NotImplementedError

    def _caption(self, widget_id: str, content) -> None:
        """Set a line under the chart. A Static's update lays the screen out again, so content it shows already
        (a redraw on resize, a move along one text) is not set twice."""
        if self._captions.get(widget_id) != content:
            self._captions[widget_id] = content
            self.query_one(f"#{widget_id}", Static).update(content)
