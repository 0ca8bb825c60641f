"""The inputs: a multi-line editor, one text per line.

The editor holds each text in its editable form (control characters as `\\x1b`-style escapes), so no
control character ever reaches the terminal from it, and a form feed or U+2028 stays inside its line;
`source()` and `contents()` give the texts back byte for byte.
"""

from __future__ import annotations

import os
from functools import partial

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from ...core.texts import NumberedTexts, numbered_texts, read_text_lines, split_lines
from ...core.visible import from_editable, to_editable
from ..engine_calls import post_result
from ..messages import EngineFailed, TextsFileRead


class TextsEditor(TextArea):
    """Every key typed here is text: Tab types a tab (it does not leave, so the next letters never become
    commands), and only Escape leaves, back to the heatmap."""

    BINDINGS = [
        Binding("escape", "leave", "Leave editor"),
        Binding("ctrl+end", "texts_end", "End of the texts", show=False),
        Binding("ctrl+home", "texts_start", "Start of the texts", show=False),
        Binding("ctrl+shift+end", "texts_end(True)", "Select to the end", show=False),
        Binding("ctrl+shift+home", "texts_start(True)", "Select to the start", show=False),
    ]

    def __init__(self, texts: list[str], **kwargs) -> None:
        super().__init__(_editable(texts), soft_wrap=False, show_line_numbers=True, tab_behavior="indent", **kwargs)
        self.indent_type = "tabs"
        self.border_title = "texts · one per line"

    def on_focus(self) -> None:
        self.border_title = "texts · one per line · Esc leaves"

    def on_blur(self) -> None:
        self.border_title = "texts · one per line · e edits"
        # Left scrolled sideways, every line would show from the middle (or not at all): back to their starts.
        self.scroll_to(x=0, animate=False)

    def action_texts_end(self, select: bool = False) -> None:
        self.move_cursor(self.document.end, select=select)

    def action_texts_start(self, select: bool = False) -> None:
        self.move_cursor(self.document.start, select=select)

    async def _on_key(self, event: events.Key) -> None:
        if event.key in ("escape", "shift+tab"):  # TextArea would move focus on either
            event.stop()
            event.prevent_default()
            if event.key == "escape":
                self.action_leave()
            return
        await super()._on_key(event)

    def source(self) -> str:
        """Every line, blank ones included, as the texts it stands for, joined by newlines."""
        return "\n".join(self._lines())

    def contents(self) -> tuple[str, NumberedTexts, int]:
        """`source()`, the non-blank lines with their editor line numbers, and how many blank lines were skipped:
        one pass over the lines (the app takes them at every edit)."""
        lines = self._lines()
        numbered = numbered_texts(lines)
        return "\n".join(lines), numbered, len(lines) - len(numbered.texts)

    def replace_texts(self, lines: list[str]) -> None:
        """Every line replaced, as one edit the editor's undo takes back."""
        self.replace(_editable(lines), self.document.start, self.document.end)

    def _lines(self) -> list[str]:
        return [from_editable(line) for line in self.text.split("\n")]

    async def _on_paste(self, event: events.Paste) -> None:
        # Pasted control characters and separators go in as escapes, like everything the editor holds.
        event.prevent_default()  # TextArea's own handler would insert the raw text as well
        event.text = _editable(split_lines(event.text))
        await super()._on_paste(event)

    class Left(Message):
        """Escape: the editor is left; its screen knows which pane is the way back."""

    def action_leave(self) -> None:
        self.post_message(self.Left())

    def load_file(self, path: str | None) -> None:
        """Replace the texts with a file's lines (one text per line, blank lines kept so the line numbers are the
        file's); a bad file changes nothing, and ctrl+z here undoes the load. None: nothing asked."""
        if not path:
            return
        if os.path.exists(path) and not os.path.isfile(path):  # a FIFO or device would block until written
            self.app.notify(
                f"{path} is not a regular file: the app reads texts from files only",
                title="texts not loaded",
                severity="error",
            )
            return
        # Read in a thread (a slow disk or network mount never stalls the keys), at most 64 MiB.
        self.run_worker(lambda: self._read_file(path), thread=True, group="texts-file", exclusive=True)

    def _read_file(self, path: str) -> None:
        post_result(
            self,
            lambda: read_text_lines(path),
            partial(TextsFileRead, path),
            partial(EngineFailed, title="texts not loaded"),  # said by the app
        )

    def on_texts_file_read(self, message: TextsFileRead) -> None:
        message.stop()
        self._show_file(message.path, message.lines)

    def _show_file(self, path: str, lines: list[str]) -> None:
        self.replace_texts(lines)  # the app hears of it as of any edit
        count = sum(1 for line in lines if line.strip())
        self.app.notify(f"{count} texts from {path} (ctrl+z in the editor brings the previous ones back)")


def _editable(texts: list[str]) -> str:
    return "\n".join(to_editable(text) for text in texts)
