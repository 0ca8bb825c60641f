"""The rollouts view (`batchtui --rollouts FILE.jsonl --model M`): a sampler's rollouts scored by the local model as a
trainer does, in a thread worker, with a progress bar; then the verdict (wrapped), the metrics (a table that scrolls:
every one reachable at 80x24), histograms of δ and of the ratio, and the worst sequences and worst tokens in two tabs.
Enter on a sequence opens its tokens at its worst one, on a token its sequence at it (`RolloutTokensScreen`)."""

from __future__ import annotations

from functools import partial

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, ProgressBar, Static, TabbedContent, TabPane
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from ...core.numbers.rollouts_summary import RolloutsSummary, WorstSequence
from ...core.rollouts.saved import SavedRollouts
from ...core.terminal.rollouts_text import (
    SEQUENCE_HEADER,
    TOKEN_HEADER,
    WORST_TOKEN_HEADER,
    bar_places,
    histogram_ticks,
    histograms,
    metric_rows,
    rollouts_verdict,
    token_row,
    token_words,
    worst_sequence_rows,
    worst_token_rows,
)
from ...core.visible import literal
from .. import chart_colors
from ..engine_calls import post_result
from ..messages import EngineFailed, RolloutsProgress, RolloutsScored
from ..move_keys import MOVE_BINDINGS
from ..widgets.steady_footer import SteadyFooter


class RolloutsScreen(Screen[None]):
    BINDINGS = [
        Binding("m", "focus_table('#rollouts-metrics')", "Metrics"),
        Binding("s", "show_worst('worst-sequences', '#rollouts-worst')", "Worst sequences"),
        Binding("t", "show_worst('worst-tokens', '#rollouts-worst-tokens')", "Worst tokens"),
    ]

    def __init__(self, job) -> None:
        super().__init__()
        self.job = job  # a `RolloutsJob` to score, or `SavedRollouts` to open
        self.summary: RolloutsSummary | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="rollouts-title", markup=False)
        with Horizontal(id="rollouts-state"):
            yield ProgressBar(id="rollouts-progress", show_eta=True)
            saved = isinstance(self.job, SavedRollouts)
            doing = "reading it…" if saved else "loading the model and checking every line…"
            yield Static(doing, id="rollouts-status", markup=False)
        with Horizontal(id="rollouts-top"):
            # values first: a narrow terminal cuts the metrics' long names, never their values
            yield DataTable(id="rollouts-metrics", cursor_type="row", zebra_stripes=True)
            with Vertical(id="rollouts-charts"):
                yield PlotextPlot(id="rollouts-delta")
                yield PlotextPlot(id="rollouts-ratio")
        with TabbedContent(id="rollouts-worst-tabs"):
            with TabPane("worst sequences (|Σ δ|)", id="worst-sequences"):
                yield DataTable(id="rollouts-worst", cursor_type="row")
            with TabPane("worst tokens (|δ|)", id="worst-tokens"):
                yield DataTable(id="rollouts-worst-tokens", cursor_type="row")
        yield SteadyFooter()

    def on_mount(self) -> None:
        self.query_one("#rollouts-metrics", DataTable).add_columns("value", "metric")
        self.query_one("#rollouts-worst", DataTable).add_columns(*SEQUENCE_HEADER)
        self.query_one("#rollouts-worst-tokens", DataTable).add_columns(*WORST_TOKEN_HEADER)
        self._score()

    def _title(self) -> str:
        if isinstance(self.job, SavedRollouts):
            run = self.job.run
            if self.job.kind == "report":
                return f"Rollouts · {literal(self.job.path, 60)} · a saved report"
            return (
                f"Rollouts · {literal(self.job.path, 60)} · records of {literal(str(run.get('model')), 40)} · "
                f"{literal(str(run.get('dtype')), 12)}" + (" · invariant mode" if run.get("invariant") is True else "")
            )
        settings = self.job.settings
        title = f"Rollouts · {literal(self.job.path, 60)} · {literal(settings.model, 40)} · {settings.dtype}"
        return title + (" · invariant mode" if settings.invariant else "")

    @work(thread=True, exclusive=True)
    def _score(self) -> None:
        worker = get_current_worker()
        from ...core.rollouts.scoring import score_rollouts

        def progress(done: int, total: int) -> None:
            self.post_message(RolloutsProgress(done, total))

        if isinstance(self.job, SavedRollouts):
            job: SavedRollouts = self.job
            post_result(self, job.summary, RolloutsScored, partial(EngineFailed, title="rollouts not read"))
            return
        post_result(
            self,
            lambda: score_rollouts(self.job, progress, cancelled=lambda: worker.is_cancelled),
            RolloutsScored,
            partial(EngineFailed, title="rollouts not scored"),
        )

    def on_rollouts_progress(self, message: RolloutsProgress) -> None:
        self._progress(message.done, message.total)

    def on_rollouts_scored(self, message: RolloutsScored) -> None:
        self._show(message.summary)

    def on_engine_failed(self, message: EngineFailed) -> None:
        message.stop()  # said here, in the status line and once as a notification
        self._failed(message.message)

    def _progress(self, done: int, total: int) -> None:
        self.query_one(ProgressBar).update(total=total, progress=done)
        self.query_one("#rollouts-status", Static).update(Text(f"{done} of {total} sequences scored"))

    def _failed(self, message: str) -> None:
        what = "not read" if isinstance(self.job, SavedRollouts) else "not scored"
        self.query_one(ProgressBar).display = False
        self.query_one("#rollouts-status", Static).update(Text(f"{what}: {message}", style="bold red"))
        self.notify(message, title=f"rollouts {what}", severity="error", markup=False)

    def _show(self, summary: RolloutsSummary) -> None:
        self.summary = summary
        self.query_one(ProgressBar).display = False
        self.query_one("#rollouts-state").add_class("done")  # the verdict wraps: all of it, at any width
        self.query_one("#rollouts-status", Static).update(Text(rollouts_verdict(summary), style="bold"))
        metrics = self.query_one("#rollouts-metrics", DataTable)
        for name, value in metric_rows(summary):
            metrics.add_row(Text(value, justify="right"), Text(name))
        worst = self.query_one("#rollouts-worst", DataTable)
        for row in worst_sequence_rows(summary, width=60):
            worst.add_row(*(Text(cell) for cell in row))
        tokens = self.query_one("#rollouts-worst-tokens", DataTable)
        for row in worst_token_rows(summary):
            tokens.add_row(*(Text(cell) for cell in row))
        for chart, (title, histogram) in zip(self.query(PlotextPlot), histograms(summary)):
            plt = chart.plt
            plt.clear_figure()
            if histogram.counts:
                plt.bar(bar_places(histogram), list(histogram.counts), width=1, color=chart_colors.OTHER)
                plt.xticks(*histogram_ticks(histogram, ratio=title.startswith("ratio")))
            plt.title(f"{title}: tokens per bin")
            chart.refresh()
        worst.focus()

    def action_focus_table(self, table: str) -> None:
        self.query_one(table, DataTable).focus()

    def action_show_worst(self, tab: str, table: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.action_focus_table(table)

    @on(DataTable.RowSelected, "#rollouts-worst")
    def _open(self, event: DataTable.RowSelected) -> None:
        if self.summary is not None and self.summary.worst_sequences:
            sequences = self.summary.worst_sequences
            index = event.cursor_row
            self.app.push_screen(RolloutTokensScreen(sequences, index, sequences[index].worst_step))

    @on(DataTable.RowSelected, "#rollouts-worst-tokens")
    def _open_at_token(self, event: DataTable.RowSelected) -> None:
        if self.summary is None or not self.summary.worst_tokens:
            return
        worst = self.summary.worst_tokens[event.cursor_row]
        sequences = self.summary.worst_sequences
        index = next((i for i, s in enumerate(sequences) if s.line == worst.line), None)
        if index is None:  # the summary keeps the worst sequences' tokens only
            self.notify(
                f"line {worst.line} is not among the {len(sequences)} worst sequences kept: its tokens are in the "
                "records file (--records)",
                severity="warning",
            )
            return
        self.app.push_screen(RolloutTokensScreen(sequences, index, worst.token.step))


class RolloutTokensScreen(Screen[None]):
    """One sequence's tokens: both logprobs, δ and the ratio; the heatmap's keys move along its tokens (←/→, home,
    end, page up/down) and to the previous or next of the worst sequences (↑/↓)."""

    BINDINGS = [Binding("escape", "dismiss", "Back"), *MOVE_BINDINGS[:-1]]

    def __init__(self, sequences: tuple[WorstSequence, ...], index: int, step: int = 0) -> None:
        super().__init__()
        self.sequences = sequences
        self.index = index
        self.step = step  # the token the cursor starts on

    def compose(self) -> ComposeResult:
        yield Static(id="tokens-title", markup=False)
        table = DataTable(id="tokens-table", cursor_type="row", zebra_stripes=True)
        table.can_focus = False  # its cursor follows the screen's keys (the heatmap's), not the table's own
        yield table
        yield Static(id="tokens-detail", markup=False)
        yield SteadyFooter()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*TOKEN_HEADER)
        self._show_sequence()

    @property
    def sequence(self) -> WorstSequence:
        return self.sequences[self.index]

    def _show_sequence(self) -> None:
        s = self.sequence
        self.query_one("#tokens-title", Static).update(
            Text(
                f"sequence {self.index + 1} of {len(self.sequences)} worst · line {s.line} · Σ δ "
                f"{s.log_ratio:.6g} · {literal(s.completion, 80)}"
            )  # fmt: skip
        )
        table = self.query_one(DataTable)
        table.clear()
        for token in s.tokens:
            table.add_row(*(Text(cell) for cell in token_row(token)))
        self.step = min(self.step, len(s.tokens) - 1)
        self._show_step()

    def _show_step(self) -> None:
        self.query_one(DataTable).move_cursor(row=self.step)
        self.query_one("#tokens-detail", Static).update(Text(token_words(self.sequence, self.step)))

    def action_move_selection(self, sequences: int, steps: int) -> None:
        if sequences:
            self.index = max(0, min(len(self.sequences) - 1, self.index + sequences))
            self._show_sequence()
            return
        self.step = max(0, min(len(self.sequence.tokens) - 1, self.step + steps))
        self._show_step()

    def action_page_selection(self, pages: int) -> None:
        self.action_move_selection(0, pages * max(1, self.query_one(DataTable).size.height - 1))

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row != self.step:  # a click
            self.step = event.cursor_row
            self.query_one("#tokens-detail", Static).update(Text(token_words(self.sequence, self.step)))
