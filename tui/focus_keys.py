"""Where keys go: Tab cycles the panes in view, Escape comes back to the heatmap from anywhere, `e` enters
the texts editor (which only Escape leaves, so typing never runs a command)."""

from __future__ import annotations

from .generation_pane import GenerationPane
from .heatmap import Heatmap
from .settings_panel import SettingsPanel
from .summary_table import SummaryTable
from .texts_editor import TextsEditor


class FocusKeys:
    """Mixed into the app, which holds `generation_view` and `action_toggle_generation`."""

    endpoint: object | None  # `--url`: only the generation view is in view

    def action_focus_editor(self) -> None:
        self.query_one(TextsEditor).focus()

    def action_focus_heatmap(self) -> None:
        """Escape, from anywhere: back to the heatmap (closing the generation view, which covers it); over a
        served model (`--url`), back to the generation view, which is all there is."""
        if self.endpoint is not None:
            self.query_one(GenerationPane).focus_table()
            return
        if self.state.generation_view:
            self.action_toggle_generation()
        self.query_one(Heatmap).focus()

    def action_focus_next(self) -> None:  # the screen's Tab: field by field on the other screens
        if len(self.screen_stack) > 1:
            super().action_focus_next()
        else:
            self._cycle_focus(1)

    def action_focus_previous(self) -> None:  # the screen's shift+Tab
        if len(self.screen_stack) > 1:
            super().action_focus_previous()
        else:
            self._cycle_focus(-1)

    def _cycle_focus(self, step: int) -> None:
        """Tab / shift+Tab: the next pane in view of heatmap (or generation table), summary and settings.
        The editor is not on the cycle: `e` enters it and Escape leaves, so typing never runs a command."""
        panes = [
            self.query_one(GenerationPane).table if self.state.generation_view else self.query_one(Heatmap),
            self.query_one(SummaryTable),
            self.query_one(SettingsPanel),
        ]
        if self.endpoint is not None:  # the summary and the settings are of local runs: hidden
            panes = panes[:1]
        focused = self.focused
        here = next((i for i, pane in enumerate(panes) if focused and pane in focused.ancestors_with_self), -1)
        target = panes[(here + step) % len(panes)]
        if isinstance(target, SettingsPanel):
            target.focus_field()
        else:
            target.focus()
