"""The inputs: a multi-line editor, one text per line."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import TextArea


class TextsEditor(TextArea):
    BINDINGS = [Binding("escape", "leave", "Leave editor")]

    def __init__(self, texts: list[str], **kwargs) -> None:
        super().__init__("\n".join(texts), soft_wrap=False, show_line_numbers=True, **kwargs)
        self.border_title = "texts · one per line"

    def texts(self) -> tuple[list[str], int]:
        """The non-blank lines, and how many blank lines were skipped."""
        lines = self.text.splitlines()
        texts = [line for line in lines if line.strip()]
        return texts, len(lines) - len(texts)

    def action_leave(self) -> None:
        self.app.action_focus_heatmap()
