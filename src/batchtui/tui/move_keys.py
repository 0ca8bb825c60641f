"""The keys that move the heatmap's selection: bound on the explorer screen (they work from every pane), and
the moves along a text again on a widget that binds the keys itself."""

from __future__ import annotations

from textual.binding import Binding

# The heatmap's moves: the screen's, so that they work from every pane; a widget that uses one of these keys
# itself (an Input's cursor keys, the summary's up/down) keeps it.
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
    Binding(b.key, f"screen.{b.action}", b.description, show=False)
    for b in MOVE_BINDINGS
    if b.action.startswith(("move_selection(0,", "page_selection"))
]
