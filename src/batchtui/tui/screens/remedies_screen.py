"""Remedies: pick toggles, measure them on the current texts, see the before/after table."""

from __future__ import annotations

from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import Checkbox, DataTable, SelectionList, Static

from ...core.experiments.kernel_classes import kernels_table, kernels_verdict
from ...core.settings import Settings
from ...core.terminal.plain import remedies_table
from ..messages import KernelClassesFound, RemediesMeasured
from ..widgets.steady_footer import SteadyFooter


class MarkedSelectionList(SelectionList[str]):
    """A selection list whose marks say selected or not (✓ or blank), not only by their colour."""

    def render_line(self, y: int) -> Strip:
        line = super().render_line(y)
        index = self.scroll_offset.y + y
        segments = list(line)
        if index >= self.option_count or len(segments) < 2 or segments[1].text != Checkbox.BUTTON_INNER:
            return line
        mark = "✓" if self.get_option_at_index(index).value in self.selected else " "  # for the X drawn either way
        segments[1] = Segment(mark, segments[1].style, segments[1].control)
        return Strip(segments, line.cell_length)


class RemediesScreen(Screen[None]):
    CSS = """
    #title {
        padding: 0 1;
        text-style: bold;
    }

    #remedy-list {
        height: auto;
        max-height: 10;
    }

    #remedy-status {
        padding: 0 1;
        color: $text-muted;
    }

    #remedy-table {
        height: 1fr;
    }
    """
    BINDINGS = [
        Binding("escape", "dismiss", "Back"),
        Binding("r", "measure", "Measure"),
        Binding("k", "kernels", "Kernel classes"),
    ]

    def __init__(self, texts: list[str], settings: Settings, on_finished=None) -> None:
        super().__init__()
        self.texts = texts
        self.settings = settings
        self.outcomes = None
        self.kernels = None  # `k`: which of the invariant mode's classes the difference comes from
        self._on_finished = on_finished  # called with the outcomes once measured (the app's report keeps them)

    def compose(self) -> ComposeResult:
        yield Static(
            "Remedies: select with space, measure with r. Each runs alone, then all together; one that cannot act "
            "here is listed with the reason. k: which of the invariant mode's classes the difference comes from.",
            id="title",
        )
        yield MarkedSelectionList(id="remedy-list")
        yield Static("", id="remedy-status")
        yield DataTable(id="remedy-table", cursor_type="row")
        yield SteadyFooter()

    def on_mount(self) -> None:
        from ...core.experiments.remedies import REMEDIES
        from ...core.models.loading import resolve_device

        device = resolve_device(self.settings.device)
        choices = self.query_one(SelectionList)
        for remedy in REMEDIES.values():
            reason = remedy.why_not(device)
            label = Text(f"{remedy.name}: {remedy.description}")
            if reason:
                label.append(f"  ({reason})", style="dim")
            # Every remedy selected: one that cannot act here costs no run and its row says why.
            choices.add_option((label, remedy.name, True))
        choices.focus()

    def action_measure(self) -> None:
        names = list(self.query_one(SelectionList).selected)
        if not names:
            self.notify("select at least one remedy", severity="warning", markup=False)
            return
        if not self.texts:
            self.notify("no texts to compare", severity="warning", markup=False)
            return
        self.query_one("#remedy-status", Static).update(Text(f"measuring {len(names)} remedies…"))
        self._measure(names)

    def _measure(self, names: list[str]) -> None:
        self.app.runs.remedies(self, self.texts, self.settings, names)

    def on_unmount(self) -> None:
        self.app.runs.cancel("remedies")  # nobody is left to see them

    def action_kernels(self) -> None:
        if not self.texts:
            self.notify("no texts to compare", severity="warning", markup=False)
            return
        status = "the invariant mode's classes one at a time, all but one, then the smallest set that is enough…"
        self.query_one("#remedy-status", Static).update(Text(status))
        self._attribute()

    def _attribute(self) -> None:
        self.app.runs.kernel_classes(self, self.texts, self.settings)

    def on_remedies_measured(self, message: RemediesMeasured) -> None:
        self._show(message.outcomes)

    def on_kernel_classes_found(self, message: KernelClassesFound) -> None:
        self._show_kernels(message.found)

    def _show_kernels(self, found) -> None:
        self.kernels = found
        header, rows = kernels_table(found)
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns(*header)
        for row in rows:
            table.add_row(*row)
        self.query_one("#remedy-status", Static).update(Text(kernels_verdict(found)))

    def _show(self, outcomes) -> None:
        self.outcomes = outcomes
        if self._on_finished is not None:
            self._on_finished(outcomes)
        table = self.query_one(DataTable)
        table.clear(columns=True)
        header, rows = remedies_table(outcomes)
        table.add_columns(*header)
        for row in rows:
            table.add_row(*row[:-1], Text(row[-1]))  # the note may quote a model's own words: never markup
        self.query_one("#remedy-status", Static).update(Text("before/after on the current texts:"))
