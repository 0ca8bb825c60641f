"""The generation view's runs: after each comparison while the view is open, each text greedy-decoded
batched and alone in a thread worker; stale or cancelled runs end without a word."""

from __future__ import annotations

from textual import work
from textual.worker import get_current_worker

from ..core.numbers.generation import GenerationComparison
from ..core.settings import Settings
from ..core.terminal.generation_text import generation_verdict
from ..core.terminal.navigation import describe_outcome
from ..core.texts import NumberedTexts
from .engine_calls import post_outcome
from .explorer_state import ExplorerState
from .generation_pane import GenerationPane
from .messages import GenerationFailed, GenerationReady, RunProgress
from .status_line import StatusLine


class GenerationRuns:
    """Mixed into the app; what it reads and changes is the app's `state`."""

    state: ExplorerState

    def action_toggle_generation(self) -> None:
        self.state.generation_view = not self.state.generation_view
        self.screen.set_class(self.state.generation_view, "-generation")
        if not self.state.generation_view:
            self.action_focus_heatmap()
            return
        self.query_one(GenerationPane).focus_table()
        if self.state.generation_on_screen is not None:
            self.query_one(GenerationPane).show(self.state.generation_on_screen, self.state.selected[0])
        elif self.state.comparison is not None:
            self.start_generation()

    def start_generation(self) -> None:
        """Generate for the texts and settings of the comparison now on screen (called once it is)."""
        self.query_one(GenerationPane).waiting("generating: batched and alone, greedy…")
        self._generate(self.state.run_texts, self.state.run_settings, self.state.run_number)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        worker = get_current_worker()

        def stale() -> bool:
            return worker.is_cancelled or not self.state.is_current(run_number)

        def run() -> GenerationComparison:
            from ..core.run.generation import generate_and_compare
            from ..core.run.skeleton import running_stage

            def progress(done: int, total: int) -> None:
                stage = running_stage(done, len(numbered.texts), settings.batch_size)
                self.post_message(RunProgress(run_number, f"generating: {stage}"))

            progress(0, 0)
            return generate_and_compare(
                numbered.texts, settings, progress=progress, cancelled=stale, lines=numbered.lines
            )

        post_outcome(self, run_number, run, GenerationReady, GenerationFailed)

    def on_generation_ready(self, message: GenerationReady) -> None:
        if not self.shows_run(message.run_number):
            return
        self.state.keep_generation(message.run_number, message.result)
        status = self.query_one(StatusLine)
        verdict = generation_verdict(message.result)
        outcome = describe_outcome(self.state.comparison, self.state.comparison.config["batch_size"])
        status.set_activity([outcome[0], verdict, *outcome[1:]])
        self.query_one(GenerationPane).show(message.result, self.state.selected[0])

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if not self.shows_run(message.run_number):
            return
        self.query_one(StatusLine).set_error(f"generation: {message.message}")
        self.query_one(GenerationPane).waiting(f"generation failed: {message.message}")
        self.notify(message.message, title="generation failed", severity="error", timeout=10)

    def on_generation_pane_text_chosen(self, message: GenerationPane.TextChosen) -> None:
        self.select(message.text, self.state.selected[1])

    def show_generation(self) -> None:
        """The selected text's generation, when the view is open and the generation is of these texts."""
        if self.state.generation_view and self.state.generation_on_screen is not None:
            self.query_one(GenerationPane).show(self.state.generation_on_screen, self.state.selected[0])
