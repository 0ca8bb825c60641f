"""Keys that move the selection: over positions and texts, to the next flip, divergent position or text,
or to the worst flip. They act wherever focus is (but in the texts editor, which types them)."""

from __future__ import annotations

from textual.binding import Binding

from ..core.terminal.navigation import next_divergent, next_flip, worst_flip

# The heatmap's moves, bound on the app so that they work from every pane; a widget that uses one of these
# keys itself (an Input's cursor keys, the summary's up/down) keeps it.
MOVE_BINDINGS = [
    Binding("left,h", "move_selection(0, -1)", "Position ←", show=False),
    Binding("right,l", "move_selection(0, 1)", "Position →", show=False),
    Binding("up,k", "move_selection(-1, 0)", "Text ↑", show=False),
    Binding("down,j", "move_selection(1, 0)", "Text ↓", show=False),
    Binding("home,g", "move_selection(0, -1_000_000_000)", "First position", show=False),
    Binding("end,G", "move_selection(0, 1_000_000_000)", "Last position", show=False),
    Binding("pageup", "page_selection(-1)", "Page ←", show=False),
    Binding("pagedown", "page_selection(1)", "Page →", show=False),
    Binding("z", "zoom", "Zoom/overview", show=False),  # the heatmap's subtitle offers it where it helps
]
# The same moves along a text for a widget that binds the keys itself (the summary's DataTable).
POSITION_BINDINGS = [
    Binding(b.key, f"app.{b.action}", b.description, show=False)
    for b in MOVE_BINDINGS
    if b.action.startswith(("move_selection(0,", "page_selection"))
]


class NavigationKeys:
    """Mixed into the app: each key finds a cell in the comparison on screen and selects it."""

    def _heatmap(self):
        from .heatmap import Heatmap

        return self.query_one(Heatmap)

    def action_move_selection(self, texts: int, positions: int) -> None:
        self._heatmap().action_move(texts, positions)

    def action_page_selection(self, pages: int) -> None:
        self._heatmap().action_page(pages)

    def action_zoom(self) -> None:
        self._heatmap().action_zoom()

    def _jump(self, finder, forward: bool, none_found: str) -> None:
        """Select the next (or previous) cell `finder` gives after the selection, or say there is none."""
        if self.state.comparison is None:
            return
        cell = finder(self.state.comparison, *self.state.selected, forward=forward)
        if cell is None:
            self.notify(none_found)
        else:
            self.select(*cell)

    def action_next_flip(self, forward: bool = True) -> None:
        self._jump(next_flip, forward, "no top-1 flip: every position predicts the same token batched and alone")

    def action_worst_flip(self) -> None:
        """The flip with the largest max|Δ| in any text (or, with none, the worst divergent position)."""
        if self.state.comparison is not None:
            cell = worst_flip(self.state.comparison)
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
        self.select(self.state.selected[0] + 1, self.state.selected[1])

    def action_previous_text(self) -> None:
        self.select(self.state.selected[0] - 1, self.state.selected[1])
