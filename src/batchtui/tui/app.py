"""The batchtui app: edit texts, change settings, and explore where batched and single logits differ.

The app owns the `ExplorerState` and is its one writer: the explorer screen and its panes post what the user did
(a move, a setting, an edit), the run controller posts what a run gave, and the handlers here change the state and
hand the screen what to draw. The app's own keys are few (help, quit, a screenshot); the explorer's are its
screen's, and act only while it is on top."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import replace
from pathlib import Path

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.widgets import DataTable, TextArea

from ..core.endpoint.report import endpoint_verdict
from ..core.errors import BatchtuiError
from ..core.settings import Settings
from ..core.terminal.generation_text import generation_verdict
from ..core.visible import literal_lines
from .daemon_executor import DaemonThreadExecutor
from .explorer_state import ExplorerState, RunKey
from .keys import LOCAL_ONLY_ACTIONS
from .messages import (
    ComparisonReady,
    EndpointReady,
    EngineFailed,
    FingerprintReady,
    GenerationFailed,
    GenerationReady,
    ModelLoaded,
    ModelLoadFailed,
    PackWritten,
    RunFailed,
    RunProgress,
)
from .outputs import AppOutputs, SessionSaver
from .run_controller import EndpointTarget, RunController
from .screens.explorer_screen import ExplorerScreen
from .screens.help_screen import HelpScreen
from .screens.prompt_screen import PromptScreen
from .views.navigation import SUMMARY_ORDERS, clamp_cell, describe_outcome
from .views.status import setup_words
from .widgets.generation_pane import GenerationPane
from .widgets.heatmap import Heatmap
from .widgets.settings_panel import SettingsPanel, next_in
from .widgets.summary_table import SummaryTable

EDIT_DEBOUNCE_S = 0.5


class BatchtuiApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "batchtui"
    # Screen classes the stylesheet uses to fit 80x24 as well as 120x40 and larger.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    # Keys on every screen (the explorer shows help and quit in its footer, in its order).
    BINDINGS = [
        Binding("question_mark,f1", "help", "Help", key_display="?/F1", show=False),
        Binding("f8", "screenshot", "Screenshot", show=False),
        Binding("q", "quit", "Quit", show=False),
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
        self.state = ExplorerState(settings, module_view=settings.modules, generation_view=endpoint is not None)
        self.runs = RunController(self, self.state.is_current, endpoint)
        # Remote code runs only for the model named with --trust-remote-code, never one switched to with M.
        self.trusted_model = settings.model if settings.trust_remote_code else None
        self.session_path = session_path  # None: nothing is saved (tests, screenshots)
        self._session_saver = SessionSaver(self.notify)
        self.outputs = AppOutputs(self)  # reports, repro packs, screenshots, the fingerprint
        self.startup_notice = startup_notice
        self.initial_texts = texts
        self.output_dir = output_dir or Path.cwd()
        self._debounce: Timer | None = None

    def notify(self, message: str, *, markup: bool = False, **kwargs) -> None:
        # Messages quote texts, paths and engine errors: shown literally, never as markup, and with any
        # control character escaped so that none reaches the terminal.
        super().notify(literal_lines(message), markup=markup, **kwargs)

    def get_default_screen(self) -> ExplorerScreen:
        self.explorer = ExplorerScreen(self.initial_texts, self.state.settings, served=self.endpoint is not None)
        return self.explorer

    def on_mount(self) -> None:
        # Engine passes run on daemon threads: quitting mid-pass does not wait for the pass to end.
        asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())
        if self.startup_notice:
            self.notify(self.startup_notice, severity="warning", timeout=15, markup=False)
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._save_and_exit)

    def on_explorer_screen_ready(self) -> None:
        self._take_texts()
        self._show_setup(self.state.settings.dtype, self.state.settings.device)
        self.save_session()  # from the first moment, a restart finds these texts
        self.explorer.action_focus_heatmap()
        self.call_after_refresh(self.action_rerun)  # the first frame comes before torch loads

    # -- runs ----------------------------------------------------------------------------

    def action_rerun(self) -> None:
        if self._debounce is not None:
            self._debounce.stop()
        if not self._take_texts():  # an edit's timer firing as the app closes: the texts are saved
            return
        numbered, blank = self.state.texts, self.state.blank_lines
        if not numbered.texts:
            self.state.run_text = self.state.editor_text
            self.notify("no texts to compare: type one per line", severity="warning")
            return
        run = self.state.start_run()
        device = self.state.comparison.config["device"] if self.state.comparison else self.state.settings.device
        self._show_setup(self.state.settings.dtype, device)  # the dtype this run uses, not the last one's
        self.show_status(blank_lines=blank, activity=("starting run",), run_started=time.monotonic())
        if self.endpoint is not None:
            self.explorer.wait_for_generation("asking the server: each text alone twice, then all under load…")
            self.runs.measure_endpoint(numbered, run)
        else:
            self.runs.compare(numbered, self.state.settings, run)

    def shows_run(self, run_number: int) -> bool:
        """Whether a worker's message about run `run_number` belongs on screen: the run is the latest and the
        app is not closing (once it is, its widgets may already be gone)."""
        return self.is_running and self.state.is_current(run_number)

    def on_run_progress(self, message: RunProgress) -> None:
        if self.shows_run(message.run_number):
            self.show_status(activity=(message.label,))

    def on_run_failed(self, message: RunFailed) -> None:
        if self.shows_run(message.run_number):
            self.state.settle(message.run_number)
            self.show_status(run_started=None, activity=("failed",), error=message.message)  # until a run succeeds
            self.notify(message.message, title="comparison failed", severity="error", timeout=10)

    def on_comparison_ready(self, message: ComparisonReady) -> None:
        if not self.shows_run(message.run_number):
            return  # a stale run's result is never shown
        comparison = message.comparison
        self.state.settle(message.run_number, comparison)
        self._show_setup(comparison.config["dtype"], comparison.config["device"])
        self.show_status(
            run_started=None,
            error="",
            activity=tuple(describe_outcome(comparison, comparison.config["batch_size"])),
            last_run_s=comparison.elapsed_s,
        )
        for note in comparison.notes:
            self.notify(note, severity="warning")
        self.explorer.show_summary(comparison, self.state)
        self.select(*self.state.selected)
        if self.state.generation_view:
            self._start_generation()

    def _start_generation(self) -> None:
        """Generate for the texts and settings of the comparison now on screen (called once it is)."""
        self.explorer.wait_for_generation("generating: batched and alone, greedy…")
        self.runs.generate(self.state.run_texts, self.state.run_settings, self.state.run_number)

    def on_generation_ready(self, message: GenerationReady) -> None:
        if not self.shows_run(message.run_number):
            return
        self.state.keep_generation(message.run_number, message.result)
        outcome = describe_outcome(self.state.comparison, self.state.comparison.config["batch_size"])
        self.show_status(activity=(outcome[0], generation_verdict(message.result), *outcome[1:]))
        self.explorer.show_generation(self.state)

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if not self.shows_run(message.run_number):
            return
        self.show_status(error=f"generation: {message.message}")
        self.explorer.wait_for_generation(f"generation failed: {message.message}")
        self.notify(message.message, title="generation failed", severity="error", timeout=10)

    def on_endpoint_ready(self, message: EndpointReady) -> None:
        if not self.shows_run(message.run_number):
            return
        result = message.result
        self.state.settle(message.run_number)
        self.state.keep_generation(message.run_number, result)
        self.show_status(
            run_started=None,
            activity=(endpoint_verdict(result),),
            last_run_s=result.elapsed_s,
            error=result.failure or "",  # what was measured before a fault stays on screen
        )
        if result.failure is not None:
            self.notify(result.failure, title="the server failed", severity="error", timeout=10)
        for note in result.notes:
            self.notify(note, severity="warning")
        self.select(*self.state.selected)

    def _show_setup(self, dtype: str, device: str) -> None:
        """The model, device and dtype in the status and the settings' title; over a server, its model and address."""
        settings = self.state.settings
        if self.endpoint is not None:
            served = self.endpoint.model or "the served model"
            self.show_status(setup=setup_words(served, self.endpoint.url, "served", False), trust_remote_code=False)
            return
        words = setup_words(settings.model, device, dtype, settings.dtype == "auto")
        self.show_status(setup=words, trust_remote_code=settings.trust_remote_code)
        self.explorer.show_setup(settings, dtype, device)

    def show_status(self, **changes) -> None:
        """Change the run status the state holds (the app is its one writer) and hand it to the status line."""
        self.state.status = replace(self.state.status, **changes)
        self.explorer.status.show(self.state.status)

    # -- the selection and the views -----------------------------------------------------

    def select(self, text: int, position: int) -> None:
        served = self.state.generation_on_screen if self.endpoint is not None else None
        if served is not None:
            self.state.selected = (max(0, min(text, len(served.texts) - 1)), 0)
        elif self.state.comparison is not None:
            self.state.selected = clamp_cell(self.state.comparison, text, position)
        else:
            return
        self.explorer.show_selection(self.state)

    def on_heatmap_move(self, message: Heatmap.Move) -> None:
        self.select(self.state.selected[0] + message.texts, self.state.selected[1] + message.positions)

    def on_heatmap_jump(self, message: Heatmap.Jump) -> None:
        self.select(message.text, message.position)

    @on(DataTable.RowHighlighted, "#summary")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Only the user's own moves in the table select; refilling it after a run moves its cursor too.
        text = self.explorer.query_one(SummaryTable).text_at(event.cursor_row)
        if event.data_table.has_focus and text != self.state.selected[0]:
            self.select(text, self.state.selected[1])

    def on_generation_pane_text_chosen(self, message: GenerationPane.TextChosen) -> None:
        self.select(message.text, self.state.selected[1])

    def on_explorer_screen_close_generation(self) -> None:
        self.action_toggle_generation()

    def action_toggle_generation(self) -> None:
        self.state.generation_view = not self.state.generation_view
        self.explorer.show_generation_view(self.state)
        if self.state.generation_view and self.state.generation_on_screen is None and self.state.comparison:
            self._start_generation()

    def action_toggle_module_view(self) -> None:
        self.state.module_view = not self.state.module_view
        if self.state.module_view and not self.state.settings.modules:
            self.apply_settings(self.state.settings.with_changes(modules=True))  # measure them first
        else:
            self.select(*self.state.selected)

    def action_cycle_summary_order(self) -> None:
        """Texts in their order, or worst first by max|Δ|, flips or KL: the worst text is a row away."""
        self.state.summary_order = next_in(SUMMARY_ORDERS, self.state.summary_order)
        if self.state.comparison is not None:
            self.explorer.show_summary(self.state.comparison, self.state)

    # -- texts and settings --------------------------------------------------------------

    def _take_texts(self) -> bool:
        """The editor's texts into the state (False once its widgets are gone: the app is closing)."""
        try:
            editor = self.explorer.editor
        except NoMatches:
            return False
        self.state.take_texts(editor.text, *editor.contents())
        return True

    def save_session(self) -> None:
        """Texts and settings to the session file; called on every edit, so a kill loses nothing typed."""
        if self.session_path is not None:
            self._session_saver.save(self.session_path, self.state.texts_source, self.state.settings)

    def _save_and_exit(self) -> None:
        self._take_texts()  # a keystroke whose edit message is still queued is not lost
        self.save_session()
        self.exit()

    async def action_quit(self) -> None:
        self._save_and_exit()

    @on(TextArea.Changed, "#editor")
    def _texts_edited(self, event: TextArea.Changed) -> None:
        self._take_texts()
        self.save_session()
        if self._debounce is not None:
            self._debounce.stop()
        if event.text_area.text != self.state.run_text:  # e.g. the editor's own first load
            self._debounce = self.set_timer(EDIT_DEBOUNCE_S, self.action_rerun)

    def on_settings_panel_changed(self, message: SettingsPanel.Changed) -> None:
        self.apply_settings(message.settings)

    def apply_settings(self, settings: Settings) -> None:
        try:
            settings.validated()
        except BatchtuiError as exc:
            self.notify(str(exc), severity="error")
            settings = self.state.settings  # the panel shows the settings still in use
        else:
            self.state.settings = settings
            self.save_session()
            self.action_rerun()
        self.explorer.show_settings(settings)

    def action_switch_model(self) -> None:
        """Another model by hub id or local path, loaded first: only a model that loads becomes the settings'
        (and the session's); one that fails is said in one line and the model in use stays."""

        def switch(model: str | None) -> None:
            if model and model != self.state.settings.model:
                trust = model == self.trusted_model
                candidate = self.state.settings.with_changes(model=model, trust_remote_code=trust)
                self.notify(f"loading the model {model}…", timeout=3)
                self.runs.load_model(candidate)

        hint = "a hub id (Qwen/Qwen2.5-1.5B-Instruct), a local folder, or tiny · "
        self.push_screen(PromptScreen("model", self.state.settings.model, hint), switch)

    def on_model_loaded(self, message: ModelLoaded) -> None:
        self.apply_settings(message.settings)

    def on_model_load_failed(self, message: ModelLoadFailed) -> None:
        still = f"{message.message} · still on {self.state.settings.model}"
        self.notify(still, title="model not switched", severity="error", timeout=15)

    def on_engine_failed(self, message: EngineFailed) -> None:
        """A run's failure that the screen which asked did not take (or the app's own: a pack)."""
        self.notify(message.message, title=message.title, severity="error", markup=False, timeout=10)

    # -- screens and output --------------------------------------------------------------

    def on_screen_key(self) -> RunKey:
        """What the remedies and the sweep run on: the editor's texts and the settings."""
        return (tuple(self.state.texts.texts), self.state.settings)

    def action_remedies(self) -> None:
        from .screens.remedies_screen import RemediesScreen

        key = self.on_screen_key()
        keep = lambda outcomes: self.state.keep_remedies(key, outcomes)  # noqa: E731
        self.push_screen(RemediesScreen(list(key[0]), key[1], on_finished=keep))

    def action_sweep(self) -> None:
        from .screens.sweep_screen import SweepScreen

        key = self.on_screen_key()
        keep = lambda done: self.state.keep_sweep(key, done)  # noqa: E731
        # A finished sweep of these texts and settings comes back as it was, not measured again.
        self.push_screen(SweepScreen(list(key[0]), key[1], finished=self.state.sweep_for(key), on_finished=keep))

    def report_on_screen(self) -> dict | None:
        return self.outputs.report_on_screen()

    def action_save_report(self) -> None:
        self.outputs.offer_report()

    def on_pack_written(self, message: PackWritten) -> None:
        self.outputs.pack_written(message.path)

    def action_show_environment(self) -> None:
        self.outputs.fingerprint()

    def on_fingerprint_ready(self, message: FingerprintReady) -> None:
        self.outputs.fingerprint_ready(message.summary)

    def action_screenshot(self) -> None:
        self.outputs.screenshot()

    def check_action(self, action: str, parameters) -> bool | None:
        return not (self.endpoint is not None and action in LOCAL_ONLY_ACTIONS)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            keys = [(b.key_display or b.key, b.description) for b in self.explorer.keys_listed(self.BINDINGS)]
            self.push_screen(HelpScreen(keys, self.output_dir, self.explorer.status.full_text()))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for binding in self.explorer.keys_listed(self.BINDINGS):
            if not binding.action.endswith("quit"):
                yield SystemCommand(
                    binding.description,
                    f"key {binding.key_display or binding.key}",
                    lambda action=binding.action: self.run_action(action, self.explorer),
                )
