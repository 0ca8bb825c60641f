"""Keys that move the selection to the next flip, divergent position or text, or to the worst flip."""

from __future__ import annotations

from ..core.views import next_divergent, next_flip, worst_flip


class NavigationKeys:
    """Mixed into the app: each key finds a cell in the comparison on screen and selects it."""

    def _jump(self, finder, forward: bool, none_found: str) -> None:
        """Select the next (or previous) cell `finder` gives after the selection, or say there is none."""
        if self.comparison is None:
            return
        cell = finder(self.comparison, *self.selected, forward=forward)
        if cell is None:
            self.notify(none_found)
        else:
            self.select(*cell)

    def action_next_flip(self, forward: bool = True) -> None:
        self._jump(next_flip, forward, "no top-1 flip: every position predicts the same token batched and alone")

    def action_worst_flip(self) -> None:
        """The flip with the largest max|Δ| in any text (or, with none, the worst divergent position)."""
        if self.comparison is not None:
            cell = worst_flip(self.comparison)
            if cell is None:
                self.notify("no divergent position: every position is allclose with no top-1 flip")
            else:
                self.select(*cell)

    def action_previous_flip(self) -> None:
        self.action_next_flip(forward=False)

    def action_next_divergent(self, forward: bool = True) -> None:
        self._jump(next_divergent, forward, "no divergent position: every position is allclose with no top-1 flip")

    def action_previous_divergent(self) -> None:
        self.action_next_divergent(forward=False)

    def action_next_text(self) -> None:
        self.select(self.selected[0] + 1, self.selected[1])

    def action_previous_text(self) -> None:
        self.select(self.selected[0] - 1, self.selected[1])
