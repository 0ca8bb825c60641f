"""Keys that change what is run: dtype, padding, batch size, positions, attention, the model, the texts."""

from __future__ import annotations

import os
from functools import partial

from ..core.errors import BatchtuiError
from ..core.settings import DTYPES, PADDING_SIDES, POSITION_MODES
from ..core.texts import read_text_lines
from .engine_calls import call_engine, on_ui_thread
from .prompt_screen import PromptScreen
from .settings_panel import BATCH_SIZES
from .texts_editor import TextsEditor

# The attention choices `a` cycles through: the model's default, then the two every model has.
ATTENTION_CHOICES = (None, "sdpa", "eager")


def next_in(values, current):
    values = list(values)
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


class SettingKeys:
    """Mixed into the app: each key makes a new `Settings` and hands it to `_apply_settings`."""

    def action_cycle_dtype(self) -> None:
        self._apply_settings(self.state.settings.with_changes(dtype=next_in(DTYPES, self.state.settings.dtype)))

    def action_toggle_padding(self) -> None:
        side = next_in(PADDING_SIDES, self.state.settings.padding_side)
        self._apply_settings(self.state.settings.with_changes(padding_side=side))

    def action_toggle_positions(self) -> None:
        positions = next_in(POSITION_MODES, self.state.settings.positions)
        self._apply_settings(self.state.settings.with_changes(positions=positions))

    def action_cycle_attention(self) -> None:
        attn = next_in(ATTENTION_CHOICES, self.state.settings.attn)
        self._apply_settings(self.state.settings.with_changes(attn=attn))

    def action_toggle_invariant(self) -> None:
        """The batch-invariant mode on or off: with it on, the heatmap shows what it leaves."""
        self._apply_settings(self.state.settings.with_changes(invariant=not self.state.settings.invariant))

    def action_cycle_batch_size(self) -> None:
        size = next_in(BATCH_SIZES, self.state.settings.batch_size)
        self._apply_settings(self.state.settings.with_changes(batch_size=size))

    def action_switch_model(self) -> None:
        """Another model by hub id or local path; a model that fails to load is said and the texts stay."""

        def switch(model: str | None) -> None:
            if model and model != self.state.settings.model:
                trust = model == self.trusted_model
                candidate = self.state.settings.with_changes(model=model, trust_remote_code=trust)
                self.notify(f"loading the model {model}…", timeout=3)
                self.run_worker(lambda: self._load_model(candidate), thread=True, group="model", exclusive=True)

        hint = "a hub id (Qwen/Qwen2.5-1.5B-Instruct), a local folder, or tiny · "
        self.push_screen(PromptScreen("model", self.state.settings.model, hint), switch)

    def _load_model(self, candidate) -> None:
        """Load the model first, in this thread worker; only a model that loads becomes the settings' (and
        the session's). On failure the model in use stays, named as before, and the reason is one line."""
        from ..core.models.loading import load_model

        call_engine(self, lambda: load_model(candidate), lambda _: self._apply_settings(candidate), self._switch_failed)

    def _switch_failed(self, message: str) -> None:
        self.notify(
            f"{message} · still on {self.state.settings.model}",
            title="model not switched",
            severity="error",
            timeout=15,
        )

    def action_open_texts(self) -> None:
        """Replace the editor's texts with a file's lines (one text per line, blank lines kept so the line
        numbers are the file's); a bad file changes nothing, and ctrl+z in the editor undoes the load."""

        def load(path: str | None) -> None:
            if not path:
                return
            if os.path.exists(path) and not os.path.isfile(path):  # a FIFO or device would block until written
                self.notify(
                    f"{path} is not a regular file: the app reads texts from files only",
                    title="texts not loaded",
                    severity="error",
                )
                return
            # Read in a thread (a slow disk or network mount never stalls the keys), at most 64 MiB.
            self.run_worker(lambda: self._read_texts_file(path), thread=True, group="texts-file", exclusive=True)

        self.push_screen(PromptScreen("texts file (one text per line)", "", "a path · "), load)

    def _read_texts_file(self, path: str) -> None:
        try:
            lines = read_text_lines(path)
        except BatchtuiError as exc:
            on_ui_thread(self, partial(self.notify, title="texts not loaded", severity="error"), str(exc))
            return
        on_ui_thread(self, self._load_texts, path, lines)

    def _load_texts(self, path: str, lines: list[str]) -> None:
        self.query_one(TextsEditor).replace_texts(lines)
        count = sum(1 for line in lines if line.strip())
        self.notify(f"{count} texts from {path} (ctrl+z in the editor brings the previous ones back)")
