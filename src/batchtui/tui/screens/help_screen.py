"""`?` / F1: every key the app answers to, from the live bindings."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...core.visible import literal

# How focus moves, then the moves whose bindings carry no description of their own.
NAVIGATION = (
    ("Tab / shift+Tab", "next / previous pane: heatmap, summary, settings (e enters the editor)"),
    ("Escape", "back to the heatmap, from anywhere (leaves the editor, closes the generation view)"),
    ("↑ ↓ in settings", "previous / next setting; enter opens a list or ticks a box"),
    ("← → / h l", "previous / next token position"),
    ("↑ ↓ / k j", "previous / next text"),
    ("Home End / g G", "first / last position of the text"),
    ("PgUp PgDn", "a screenful of positions back / on"),
    ("z", "long texts: the whole text (each cell the worst of its span) / zoom to the selection"),
)


class HelpScreen(ModalScreen[None]):
    CSS = """
    HelpScreen {
        align: center middle;
    }

    #help {
        width: 70;
        max-width: 95%;
        height: auto;
        max-height: 90%;
        border: round $accent;
        background: $surface;
        padding: 1 2;
        scrollbar-size-horizontal: 1;
        scrollbar-size-vertical: 1;
    }

    #help .help-heading {
        text-style: bold;
        margin-bottom: 1;
    }

    #help-status {
        margin-bottom: 1;
    }

    #help-hint {
        margin-top: 1;
        color: $text-muted;
    }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close help")]

    def __init__(self, bindings: list[tuple[str, str]], output_dir: Path, status: str = "") -> None:
        super().__init__()
        self._keys = bindings
        self._output_dir = output_dir
        self._status = status  # the status line's whole account, parts it has no room for included

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 2), show_header=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for keys, description in (*NAVIGATION, *self._keys):
            table.add_row(keys, description)
        with VerticalScroll(id="help"):
            if self._status:
                yield Static("status", classes="help-heading")
                yield Static(Text(self._status), id="help-status")
            yield Static("batchtui keys", classes="help-heading")
            yield Static(table)
            yield Static(
                Text(f"ctrl+s and f8 write to {literal(str(self._output_dir))} (--output-dir DIR sets it)."),
                id="help-output",
            )
            yield Static("All of these are also in the command palette (ctrl+p). escape closes.", id="help-hint")
