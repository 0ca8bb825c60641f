"""The batchtui app: edit texts, change settings, and explore where batched and single logits differ."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import DataTable, TextArea
from textual.worker import get_current_worker

from ..core.errors import BatchtuiError, Cancelled
from ..core.numbers.comparison import Comparison
from ..core.settings import Settings
from ..core.terminal.navigation import SUMMARY_ORDERS, clamp_cell, describe_outcome
from ..core.texts import NumberedTexts
from ..core.visible import literal_lines
from .daemon_executor import DaemonThreadExecutor
from .detail import DetailPane
from .endpoint_runs import LOCAL_ONLY_ACTIONS, EndpointRuns, EndpointTarget
from .engine_calls import post_outcome
from .explorer_state import ExplorerState, RunKey
from .focus_keys import FocusKeys
from .generation_pane import GenerationPane
from .generation_runs import GenerationRuns
from .heatmap import Heatmap
from .help_screen import HelpScreen
from .layers import LayersPane
from .messages import ComparisonReady, RunFailed, RunProgress
from .navigation_keys import MOVE_BINDINGS, NavigationKeys
from .output_actions import OutputActions, SessionSaver
from .pack_actions import PackActions
from .setting_keys import SettingKeys, next_in
from .settings_panel import SettingsPanel
from .status_line import StatusLine
from .steady_footer import SteadyFooter
from .summary_table import SummaryTable
from .texts_editor import TextsEditor
from .topk_pane import TopkPane

EDIT_DEBOUNCE_S = 0.5


class BatchtuiApp(
    EndpointRuns, GenerationRuns, FocusKeys, NavigationKeys, SettingKeys, OutputActions, PackActions, App[None]
):
    CSS_PATH = "app.tcss"
    TITLE = "batchtui"
    # Screen classes the stylesheet uses to fit 80x24 as well as 120x40 and larger.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    # In the footer's order: help first, so that it shows on a narrow screen too.
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help", key_display="?/F1"),
        *MOVE_BINDINGS,
        Binding("escape", "focus_heatmap", "Back to the heatmap", show=False),
        Binding("e", "focus_editor", "Edit texts"),
        Binding("n", "next_divergent", "Next divergent"),
        Binding("N", "previous_divergent", "Prev divergent", key_display="N", show=False),
        Binding("f", "next_flip", "Next flip"),
        Binding("F", "previous_flip", "Prev flip", key_display="F", show=False),
        Binding("w", "worst_flip", "Worst flip"),
        Binding("right_square_bracket", "next_text", "Next text", key_display="]", show=False),
        Binding("left_square_bracket", "previous_text", "Prev text", key_display="[", show=False),
        Binding("t", "toggle_topk", "Top-k chart"),
        Binding("c", "toggle_generation", "Continuations"),
        Binding("r", "rerun", "Re-run"),
        Binding("d", "cycle_dtype", "dtype"),
        Binding("p", "toggle_padding", "Padding side"),
        Binding("b", "cycle_batch_size", "Batch size"),
        Binding("o", "toggle_positions", "Positions", show=False),
        Binding("a", "cycle_attention", "Attention", show=False),
        Binding("i", "toggle_invariant", "Invariant mode", show=False),
        Binding("L", "toggle_layers", "Detail/layers", key_display="L", show=False),
        Binding("s", "cycle_summary_order", "Sort summary", show=False),
        Binding("m", "toggle_module_view", "Layers/modules"),
        Binding("M", "switch_model", "Model…", key_display="M", show=False),
        Binding("ctrl+o", "open_texts", "Open texts file…", show=False),
        Binding("R", "remedies", "Remedies", key_display="R"),
        Binding("S", "sweep", "Sweep", key_display="S"),
        Binding("ctrl+s", "save_report", "Save report"),
        Binding("I", "show_environment", "Fingerprint", key_display="I", show=False),
        Binding("f8", "screenshot", "Screenshot", show=False),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        texts: list[str],
        settings: Settings,
        output_dir: Path | None = None,
        session_path: Path | None = None,
        startup_notice: str | None = None,
        endpoint: EndpointTarget | None = None,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint  # `--url`: a served model answers, in the generation view
        self.state = ExplorerState(settings, module_view=settings.modules)
        # Remote code runs only for the model named with --trust-remote-code, never one switched to with M.
        self.trusted_model = settings.model if settings.trust_remote_code else None
        self.session_path = session_path  # None: nothing is saved (tests, screenshots)
        self.threads: int | None = None  # --threads: torch's CPU threads (None: the free cores less one)
        self._session_saver = SessionSaver(self.notify)
        self.startup_notice = startup_notice
        self.initial_texts = texts
        self.output_dir = output_dir or Path.cwd()
        self._debounce: Timer | None = None

    def notify(self, message: str, *, markup: bool = False, **kwargs) -> None:
        # Messages quote texts, paths and engine errors: shown literally, never as markup, and with any
        # control character escaped so that none reaches the terminal.
        super().notify(literal_lines(message), markup=markup, **kwargs)

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield TextsEditor(self.initial_texts, id="editor")
                yield SettingsPanel(self.state.settings, id="settings")
                yield SummaryTable(id="summary")
            with Vertical(id="right"):
                yield Heatmap(id="heatmap")
                yield DetailPane(id="detail")
                yield LayersPane(id="layers")
                yield TopkPane(id="topk")
                yield GenerationPane(id="generation")
        yield StatusLine(id="status")
        yield SteadyFooter()

    def on_mount(self) -> None:
        # Engine passes run on daemon threads: quitting mid-pass does not wait for the pass to end.
        asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())
        if self.startup_notice:
            self.notify(self.startup_notice, severity="warning", timeout=15, markup=False)
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._save_and_exit)
        if self.endpoint is not None:
            self.state.generation_view = True
            self.screen.add_class("-generation", "-endpoint")
        self._show_setup(self.state.settings.dtype, self.state.settings.device)
        self.save_session()  # from the first moment, a restart finds these texts
        self.action_focus_heatmap()
        self.call_after_refresh(self.action_rerun)  # the first frame comes before torch loads

    # -- running comparisons -------------------------------------------------------------

    def action_rerun(self) -> None:
        if self._debounce is not None:
            self._debounce.stop()
        editor = self.query_one(TextsEditor)
        numbered, blank = editor.numbered()
        if not numbered.texts:
            self.state.run_text = editor.text
            self.notify("no texts to compare: type one per line", severity="warning")
            return
        run = self.state.start_run(editor.text, numbered)
        status = self.query_one(StatusLine)
        device = self.state.comparison.config["device"] if self.state.comparison else self.state.settings.device
        self._show_setup(self.state.settings.dtype, device)  # the dtype this run uses, not the last one's
        status.set_skipped(blank)
        status.set_activity("starting run")
        status.start_run()
        if self.endpoint is not None:
            self.start_endpoint_run(numbered, run)
        else:
            self._compare(numbered, self.state.settings, run)

    @work(thread=True, exclusive=True, group="compare")
    def _compare(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        texts = numbered.texts
        worker = get_current_worker()

        def stale() -> bool:
            return worker.is_cancelled or not self.state.is_current(run_number)

        def run() -> Comparison:
            from ..core.models.loading import load_model
            from ..core.numbers.cpu_memory import keep_freed_memory
            from ..core.run.engine import compare  # torch loads here, off the UI thread
            from ..core.run.first_op import with_first_ops
            from ..core.run.skeleton import passes_per_text, running_stage
            from ..core.threads import use_threads

            use_threads(self.threads)
            keep_freed_memory()
            self.post_message(RunProgress(run_number, f"loading the model {settings.model}"))
            load_model(settings)
            if stale():
                raise Cancelled("a newer run started while the model loaded")

            def progress(done: int, total: int) -> None:
                stage = running_stage(done, len(texts), settings.batch_size, passes_per_text(settings))
                self.post_message(RunProgress(run_number, stage))

            progress(0, 0)
            result = compare(texts, settings, progress=progress, cancelled=stale, lines=numbered.lines)
            # The module view: inside each divergent text's first module, its first op.
            return with_first_ops(result, texts, settings) if settings.modules and not stale() else result

        post_outcome(self, run_number, run, ComparisonReady, RunFailed)

    def shows_run(self, run_number: int) -> bool:
        """Whether a worker's message about run `run_number` belongs on screen: the run is the latest and the
        app is not closing (once it is, its widgets may already be gone)."""
        return self.is_running and self.state.is_current(run_number)

    def on_run_progress(self, message: RunProgress) -> None:
        if self.shows_run(message.run_number):
            self.query_one(StatusLine).set_activity(message.label)

    def on_run_failed(self, message: RunFailed) -> None:
        if self.shows_run(message.run_number):
            self.state.settle(message.run_number)
            status = self.query_one(StatusLine)
            status.end_run()
            status.set_activity("failed")
            status.set_error(message.message)  # stays until a run succeeds
            self.notify(message.message, title="comparison failed", severity="error", timeout=10)

    def on_comparison_ready(self, message: ComparisonReady) -> None:
        if not self.shows_run(message.run_number):
            return  # a stale run's result is never shown
        comparison = message.comparison
        self.state.settle(message.run_number, comparison)
        status = self.query_one(StatusLine)
        status.end_run()
        status.clear_error()
        self._show_setup(comparison.config["dtype"], comparison.config["device"])
        status.set_activity(describe_outcome(comparison, comparison.config["batch_size"]))
        status.set_last_run(comparison.elapsed_s)
        for note in comparison.notes:
            self.notify(note, severity="warning")
        self.query_one(SummaryTable).show(comparison, self.state.selected[0], self.state.summary_order)
        self.select(*self.state.selected)
        if self.state.generation_view:
            self.start_generation()

    def _show_setup(self, dtype: str, device: str) -> None:
        """The model, device and dtype in the status line and the settings' title; `auto` as what it
        resolved to, once a run has loaded the model."""
        s = self.state.settings
        if self.endpoint is not None:
            model = self.endpoint.model or "the served model"
            self.query_one(StatusLine).set_setup(model, self.endpoint.url, "served", False)
            return
        shown = f"{dtype} (auto)" if s.dtype == "auto" and dtype != "auto" else dtype
        self.query_one(StatusLine).set_setup(s.model, device, shown, s.trust_remote_code)
        panel = self.query_one(SettingsPanel)
        panel.show_model(s.model, device)
        panel.show_resolved_dtype(dtype if s.dtype == "auto" else None)

    # -- selection -----------------------------------------------------------------------

    def select(self, text: int, position: int) -> None:
        served = self.state.generation_on_screen if self.endpoint is not None else None
        if served is not None:
            self.state.selected = (max(0, min(text, len(served.texts) - 1)), 0)
            self.show_generation()
            return
        if self.state.comparison is None:
            return
        self.state.selected = clamp_cell(self.state.comparison, text, position)
        self.query_one(Heatmap).show(self.state.comparison, self.state.selected)
        self.query_one(DetailPane).show(self.state.comparison, self.state.selected)
        self.query_one(LayersPane).show(self.state.comparison, self.state.selected[0], self.state.module_view)
        self.query_one(TopkPane).show(self.state.comparison, self.state.selected)
        self.query_one(SummaryTable).select_text(self.state.selected[0])
        self.show_generation()

    def on_heatmap_move(self, message: Heatmap.Move) -> None:
        self.select(self.state.selected[0] + message.texts, self.state.selected[1] + message.positions)

    @on(DataTable.RowHighlighted, "#summary")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Only the user's own moves in the table select; refilling it after a run moves its cursor too.
        text = self.query_one(SummaryTable).text_at(event.cursor_row)
        if event.data_table.has_focus and text != self.state.selected[0]:
            self.select(text, self.state.selected[1])

    # -- inputs and settings -------------------------------------------------------------

    def save_session(self) -> None:
        """Texts and settings to the session file; called on every edit, so a kill loses nothing typed."""
        if self.session_path is not None:
            self._session_saver.save(self.session_path, self.query_one(TextsEditor).source(), self.state.settings)

    def _save_and_exit(self) -> None:
        self.save_session()
        self.exit()

    async def action_quit(self) -> None:
        self._save_and_exit()

    @on(TextArea.Changed, "#editor")
    def _texts_edited(self, event: TextArea.Changed) -> None:
        self.save_session()
        if self._debounce is not None:
            self._debounce.stop()
        if event.text_area.text != self.state.run_text:  # e.g. the editor's own first load
            self._debounce = self.set_timer(EDIT_DEBOUNCE_S, self.action_rerun)

    def on_settings_panel_changed(self, message: SettingsPanel.Changed) -> None:
        self._apply_settings(message.settings)

    def _apply_settings(self, settings: Settings) -> None:
        try:
            settings.validated()
        except BatchtuiError as exc:
            self.notify(str(exc), severity="error")
            return
        self.state.settings = settings
        self.query_one(SettingsPanel).show(settings)
        self.save_session()
        self.action_rerun()

    def action_cycle_summary_order(self) -> None:
        """Texts in their order, or worst first by max|Δ|, flips or KL: the worst text is a row away."""
        self.state.summary_order = next_in(SUMMARY_ORDERS, self.state.summary_order)
        if self.state.comparison is not None:
            self.query_one(SummaryTable).show(self.state.comparison, self.state.selected[0], self.state.summary_order)

    # -- output --------------------------------------------------------------------------

    def action_toggle_module_view(self) -> None:
        self.state.module_view = not self.state.module_view
        if self.state.module_view and not self.state.settings.modules:
            self._apply_settings(self.state.settings.with_changes(modules=True))  # measure them first
        else:
            self.select(*self.state.selected)

    def on_screen_key(self) -> RunKey:
        """What the remedies and the sweep run on: the editor's texts and the settings."""
        return (tuple(self.query_one(TextsEditor).numbered()[0].texts), self.state.settings)

    def action_remedies(self) -> None:
        from .remedies_screen import RemediesScreen

        key = self.on_screen_key()
        self.push_screen(
            RemediesScreen(list(key[0]), key[1], on_finished=lambda outcomes: self.state.keep_remedies(key, outcomes))
        )

    def action_sweep(self) -> None:
        from .sweep_screen import SweepScreen

        key = self.on_screen_key()
        # A finished sweep of these texts and settings comes back as it was, not measured again.
        finished = self.state.sweep_for(key)
        self.push_screen(
            SweepScreen(
                list(key[0]), key[1], finished=finished, on_finished=lambda done: self.state.keep_sweep(key, done)
            )
        )

    def action_toggle_layers(self) -> None:
        if not self.screen.has_class("-short"):
            self.notify("the detail and the layers are both in view at this size: L swaps them on short screens")
            return
        self.screen.toggle_class("-layers")

    def action_toggle_topk(self) -> None:
        """The lower slot between the layers and the top-k chart; on a short screen, the chart in view."""
        screen = self.screen
        if screen.has_class("-short") and not screen.has_class("-layers"):
            screen.add_class("-layers", "-topk")
        else:
            screen.toggle_class("-topk")

    def check_action(self, action: str, parameters) -> bool | None:
        # Over the remedies, sweep or help screen only the app-wide keys act.
        app_wide = ("quit", "help", "screenshot", "command_palette", "focus_next", "focus_previous")
        if len(self.screen_stack) > 1 and action not in app_wide:
            return False
        return not (self.endpoint is not None and action in LOCAL_ONLY_ACTIONS)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            keys = [
                (b.key_display or b.key, b.description)
                for b in self.BINDINGS
                if b not in MOVE_BINDINGS and self.check_action(b.action, ()) is not False
            ]
            self.push_screen(HelpScreen(keys, self.output_dir, self.query_one(StatusLine).full_text()))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            if binding.action != "quit":
                yield SystemCommand(
                    binding.description,
                    f"key {binding.key_display or binding.key}",
                    lambda action=binding.action: self.run_action(action),
                )
