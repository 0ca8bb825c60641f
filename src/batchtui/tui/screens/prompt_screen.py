"""A one-line question over the app (a model id or path, a texts file): enter answers, escape cancels."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class PromptScreen(ModalScreen[str | None]):
    CSS = """
    PromptScreen {
        align: center middle;
    }

    #prompt {
        width: 70;
        max-width: 95%;
        height: auto;
        border: round $accent;
        background: $surface;
        padding: 1 2;
    }

    #prompt-hint {
        color: $text-muted;
    }
    """
    BINDINGS = [Binding("escape", "dismiss", "Cancel")]

    def __init__(self, question: str, value: str = "", hint: str = "") -> None:
        super().__init__()
        self._question = question
        self._value = value
        self._hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Static(self._question, id="prompt-title", markup=False)
            yield Input(self._value, id="prompt-input", select_on_focus=True)
            yield Static(f"{self._hint}enter: ok · escape: cancel", id="prompt-hint", markup=False)

    @on(Input.Submitted)
    def _answered(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
