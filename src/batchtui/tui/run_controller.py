"""The app's engine runs, each in a thread worker of its own group (a newer run of a group cancels the older):
comparisons, generations, a served model's continuations, a model switch, a repro pack, the fingerprint, and the
sweep, remedies and kernel classes of their screens.

It reads the app's state only to tell a stale run (`is_current`) and changes none: a run's outcome comes back
to the app as a message carrying its run number, or through the callbacks it is given, on the UI thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from textual.app import App
from textual.worker import get_current_worker

from ..core.endpoint.result import EndpointComparison
from ..core.numbers.comparison import Comparison
from ..core.numbers.generation import GenerationComparison
from ..core.one_run import one_run_at_a_time
from ..core.settings import Settings
from ..core.texts import NumberedTexts
from .engine_calls import call_engine, on_ui_thread, post_outcome
from .messages import ComparisonReady, EndpointReady, GenerationFailed, GenerationReady, RunFailed, RunProgress

# What the status line says while an older, cancelled run finishes its pass (runs take turns: `core.one_run`).
_WAITING = "waiting for the previous run to stop"


@dataclass(frozen=True)
class EndpointTarget:
    """The server the app asks: its address, the model (None: the only one it serves), the API key's variable."""

    url: str
    model: str | None = None
    api_key_env: str | None = None


class RunController:
    def __init__(self, app: App, is_current: Callable[[int], bool], endpoint: EndpointTarget | None) -> None:
        self._app = app
        self._is_current = is_current  # whether a run number is still the latest
        self.endpoint = endpoint
        self.threads: int | None = None  # --threads: torch's CPU threads (None: torch's own count)

    def _start(self, work: Callable[[], None], group: str, exclusive: bool = True) -> None:
        self._app.run_worker(work, thread=True, exclusive=exclusive, group=group)

    def _stale_check(self, run_number: int) -> Callable[[], bool]:
        """For the worker that calls it: whether its run was cancelled or a newer run started."""
        worker = get_current_worker()
        return lambda: worker.is_cancelled or not self._is_current(run_number)

    def _progress(self, run_number: int, label: str) -> None:
        self._app.post_message(RunProgress(run_number, label))

    def _turn(self, run_number: int):
        """Run `run_number`'s turn (`core.one_run`): the status line says so while it waits for the previous run."""
        return one_run_at_a_time(waiting=lambda: self._progress(run_number, _WAITING))

    def compare(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        """Compare the texts batched and alone; `ComparisonReady` or `RunFailed`."""
        self._start(lambda: self._compare(numbered, settings, run_number), "compare")

    def _compare(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        texts = numbered.texts
        stale = self._stale_check(run_number)

        def run() -> Comparison:
            from ..core.errors import Cancelled
            from ..core.models.loading import load_model
            from ..core.numbers.cpu_memory import keep_freed_memory
            from ..core.run.engine import compare  # torch loads here, off the UI thread
            from ..core.run.first_op import with_first_ops
            from ..core.run.skeleton import passes_per_text, running_stage
            from ..core.threads import use_threads

            def progress(done: int, total: int) -> None:
                stage = running_stage(done, len(texts), settings.batch_size, passes_per_text(settings))
                self._progress(run_number, stage)

            with self._turn(run_number):
                if stale():
                    raise Cancelled("a newer run started while this one waited")
                use_threads(self.threads)
                keep_freed_memory()
                self._progress(run_number, f"loading the model {settings.model}")
                load_model(settings)
                if stale():
                    raise Cancelled("a newer run started while the model loaded")
                progress(0, 0)
                result = compare(texts, settings, progress=progress, cancelled=stale, lines=numbered.lines)
                # The module view: inside each divergent text's first module, its first op.
                return with_first_ops(result, texts, settings) if settings.modules and not stale() else result

        post_outcome(self._app, run_number, run, ComparisonReady, RunFailed)

    def generate(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        """Greedy-decode each text batched and alone; `GenerationReady` or `GenerationFailed`."""
        self._start(lambda: self._generate(numbered, settings, run_number), "generate")

    def _generate(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        stale = self._stale_check(run_number)

        def run() -> GenerationComparison:
            from ..core.run.generation import generate_and_compare
            from ..core.run.skeleton import running_stage

            def progress(done: int, total: int) -> None:
                stage = running_stage(done, len(numbered.texts), settings.batch_size)
                self._progress(run_number, f"generating: {stage}")

            with self._turn(run_number):
                progress(0, 0)
                return generate_and_compare(
                    numbered.texts,
                    settings,
                    progress=progress,
                    cancelled=stale,
                    lines=numbered.lines,
                    vs_prefill=True,  # both checks of how the tokens arrive, in the view's line under the table
                    vs_trainer=True,
                )

        post_outcome(self._app, run_number, run, GenerationReady, GenerationFailed)

    def measure_endpoint(self, numbered: NumberedTexts, run_number: int) -> None:
        """Complete the texts on the server alone and under load; `EndpointReady` or `RunFailed`."""
        self._start(lambda: self._measure_endpoint(numbered, run_number), "endpoint")

    def _measure_endpoint(self, numbered: NumberedTexts, run_number: int) -> None:
        target = self.endpoint
        stale = self._stale_check(run_number)

        def run() -> EndpointComparison:
            from ..core.endpoint.client import Endpoint
            from ..core.endpoint.run import measure_endpoint

            self._progress(run_number, f"asking {target.url} for its models")
            endpoint = Endpoint(target.url, target.model, target.api_key_env)
            try:
                model = endpoint.resolve_model()

                def progress(done: int, total: int) -> None:
                    self._progress(run_number, f"requests {done}/{total}")

                config = {"url": endpoint.url, "model": model}
                return measure_endpoint(
                    endpoint, numbered.texts, numbered.lines, config=config, progress=progress, cancelled=stale
                )
            finally:
                endpoint.close()

        post_outcome(self._app, run_number, run, EndpointReady, RunFailed)

    def load_model(self, candidate: Settings, on_loaded: Callable, on_failed: Callable[[str], None]) -> None:
        """Load `candidate`'s model (a switch with M): `on_loaded(model)` or `on_failed(message)`."""

        def run() -> None:
            from ..core.models.loading import load_model  # torch loads here, off the UI thread

            call_engine(self._app, lambda: load_model(candidate), on_loaded, on_failed)

        self._start(run, "model")

    def write_pack(self, path: Path, numbered: NumberedTexts, settings: Settings, said: Callable[..., None]) -> None:
        """Run the texts again and write a repro pack to `path`; `said(message, ...)` tells how it went."""

        def run() -> None:
            from ..core.run.repro_pack import make_pack

            call_engine(
                self._app,
                lambda: make_pack(path, numbered.texts, numbered.lines, settings),
                lambda _: said(f"repro pack written to {path.resolve()}", title="pack saved", timeout=10),
                lambda message: said(message, title="pack not written", severity="error", timeout=10),
            )

        self._start(run, "pack", exclusive=False)

    def fingerprint(self, texts: list[str], settings: Settings, on_ready: Callable[[str], None]) -> None:
        """The environment's one-line fingerprint (the model's files hashed once), to `on_ready`."""

        def run() -> None:
            from ..core.reports.environment import environment, environment_summary

            served = None
            if self.endpoint is not None:  # checked at launch: no credentials in the URL
                served = {"url": self.endpoint.url, "model": self.endpoint.model}
            call_engine(
                self._app,
                lambda: environment_summary(environment(settings.model, texts, settings.invariant, served)),
                on_ready,
            )

        self._start(run, "environment")

    # -- the experiments of a screen: its results go to it (dropped once it has closed) ----------------------------

    def cancel(self, group: str) -> None:
        """Cancel the runs of `group` (a screen that closes cancels its own)."""
        self._app.workers.cancel_group(self._app, group)

    def sweep(self, screen, texts: list[str], settings: Settings, axes, on_progress: Callable, on_cells: Callable):
        """The grid of `axes` (dtypes, batch sizes) over `texts`: `on_progress(done, total, cell)` after each cell
        (cell None before the first), then `on_cells(cells)`, on the UI thread."""

        def run() -> None:
            from ..core.experiments.sweep import sweep, sweep_grid
            from ..core.run.engine import compare  # torch loads here, off the UI thread

            worker = get_current_worker()
            grid = sweep_grid(settings, *axes, [settings.attn or "default"], [settings.padding_side])
            on_ui_thread(screen, on_progress, 0, len(grid), None)

            def progress(done: int, total: int, cell) -> None:
                on_ui_thread(screen, on_progress, done, total, cell)

            cancelled = lambda: worker.is_cancelled  # noqa: E731
            call_engine(screen, lambda: sweep(texts, grid, compare, progress=progress, cancelled=cancelled), on_cells)

        self._start(run, "sweep")

    def remedies(self, screen, texts: list[str], settings: Settings, names: list[str], on_outcomes: Callable) -> None:
        """Each remedy in `names` measured on `texts`, then all together: `on_outcomes(outcomes)`."""

        def run() -> None:
            from ..core.experiments.remedies import compare_remedies

            call_engine(
                screen, lambda: compare_remedies(texts, settings, names, self._cancellable_compare()), on_outcomes
            )

        self._start(run, "remedies")

    def kernel_classes(self, screen, texts: list[str], settings: Settings, on_found: Callable) -> None:
        """Which of the batch-invariant mode's classes the difference comes from (`attribute_kernels`)."""

        def run() -> None:
            from ..core.experiments.kernel_classes import attribute_kernels

            plain, compare_fn = (
                settings.with_changes(invariant=False, invariant_classes=""),
                self._cancellable_compare(),
            )
            call_engine(screen, lambda: attribute_kernels(texts, plain, compare_fn), on_found)

        self._start(run, "remedies")

    @staticmethod
    def _cancellable_compare() -> Callable:
        """For the worker that calls it: `compare(texts, settings)` ended when the worker is cancelled."""
        from ..core.run.engine import compare

        worker = get_current_worker()
        return lambda texts, settings: compare(texts, settings, cancelled=lambda: worker.is_cancelled)
