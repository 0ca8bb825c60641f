"""The app's engine runs, each in a thread worker of its own group (a newer run of a group cancels the older):
comparisons, generations, a served model's continuations, a model switch, a repro pack, the fingerprint, and the
sweep, remedies and kernel classes of their screens.

It reads the app's state only to tell a stale run (`is_current`) and changes none: every run's outcome comes back
as a message (`messages.py`), to the app or to the screen that asked; a comparison's, generation's or served run's
carries its run number."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from textual.app import App
from textual.message_pump import MessagePump
from textual.worker import get_current_worker

from ..core.endpoint.result import EndpointComparison
from ..core.numbers.comparison import Comparison
from ..core.numbers.generation_result import GenerationComparison
from ..core.one_run import one_run_at_a_time
from ..core.settings import Settings
from ..core.texts import NumberedTexts
from .engine_calls import post_outcome, post_result
from .messages import (
    ComparisonReady,
    EndpointReady,
    EngineFailed,
    FingerprintReady,
    GenerationFailed,
    GenerationReady,
    KernelClassesFound,
    ModelLoaded,
    ModelLoadFailed,
    PackWritten,
    RemediesMeasured,
    RunFailed,
    RunProgress,
    SweepDone,
    SweepProgress,
)

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

    @contextlib.contextmanager
    def _turn(self, run_number: int) -> Iterator[None]:
        """Run `run_number`'s turn (`core.one_run`): the status line says so while it waits for the previous run, and
        what the mode measures while its first passes on this machine measure it."""
        from ..core.invariant.measuring import Measuring, measuring_reported

        def measuring(event: Measuring) -> None:
            if event.notice is not None:
                self._app.call_from_thread(self._app.notify, event.notice, severity="warning")
            elif not event.finished:
                self._progress(run_number, event.words())

        with one_run_at_a_time(waiting=lambda: self._progress(run_number, _WAITING)), measuring_reported(measuring):
            yield

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
            from ..core.run.comparison_job import ComparisonJob  # torch loads here, off the UI thread
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
                # The module view: inside each divergent text's first module, its first op.
                return ComparisonJob(numbered, settings, ops=settings.modules).run(progress, stale)

        post_outcome(self._app, run_number, run, ComparisonReady, RunFailed)

    def generate(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        """Greedy-decode each text batched and alone; `GenerationReady` or `GenerationFailed`."""
        self._start(lambda: self._generate(numbered, settings, run_number), "generate")

    def _generate(self, numbered: NumberedTexts, settings: Settings, run_number: int) -> None:
        stale = self._stale_check(run_number)

        def run() -> GenerationComparison:
            from ..core.run.generation_run import generate_and_compare
            from ..core.run.skeleton import generation_stage

            checks = ("decode vs prefill", "trainer vs sampler")

            def progress(done: int, total: int) -> None:
                stage = generation_stage(done, total, len(numbered.texts), settings.batch_size, checks)
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

    def load_model(self, candidate: Settings) -> None:
        """Load `candidate`'s model (a switch with M): `ModelLoaded` or `ModelLoadFailed`."""

        def run() -> None:
            from ..core.models.loading import load_model  # torch loads here, off the UI thread

            post_result(self._app, lambda: load_model(candidate), lambda _: ModelLoaded(candidate), ModelLoadFailed)

        self._start(run, "model")

    def write_pack(self, path: Path, numbered: NumberedTexts, settings: Settings) -> None:
        """Run the texts again and write a repro pack to `path`: `PackWritten`, or `EngineFailed`."""

        def run() -> None:
            from ..core.run.repro_pack import make_pack

            post_result(
                self._app,
                lambda: make_pack(path, numbered, settings),
                lambda _: PackWritten(path),
                partial(EngineFailed, title="pack not written"),
            )

        self._start(run, "pack", exclusive=False)

    def fingerprint(self, texts: list[str], settings: Settings) -> None:
        """The environment's one-line fingerprint (the model's files hashed once): `FingerprintReady`."""

        def run() -> None:
            from ..core.reports.environment import environment, environment_summary

            served = None
            if self.endpoint is not None:  # checked at launch: no credentials in the URL
                served = {"url": self.endpoint.url, "model": self.endpoint.model}
            post_result(
                self._app,
                lambda: environment_summary(environment(settings.model, texts, settings.invariant, served)),
                FingerprintReady,
            )

        self._start(run, "environment")

    # -- the experiments of a screen: their messages go to it (none once it has closed) ----------------------------

    def cancel(self, group: str) -> None:
        """Cancel the runs of `group` (a screen that closes cancels its own)."""
        self._app.workers.cancel_group(self._app, group)

    def sweep(self, screen: MessagePump, texts: list[str], settings: Settings, axes) -> None:
        """The grid of `axes` (dtypes, batch sizes) over `texts`: `SweepProgress` after each cell (and before the
        first), then `SweepDone`."""

        def run() -> None:
            from ..core.experiments.sweep import sweep, sweep_grid
            from ..core.run.engine import compare  # torch loads here, off the UI thread

            worker = get_current_worker()
            grid = sweep_grid(settings, *axes, [settings.attn or "default"], [settings.padding_side])
            screen.post_message(SweepProgress(0, len(grid), None))

            def progress(done: int, total: int, cell) -> None:
                screen.post_message(SweepProgress(done, total, cell))

            cancelled = lambda: worker.is_cancelled  # noqa: E731
            post_result(screen, lambda: sweep(texts, grid, compare, progress=progress, cancelled=cancelled), SweepDone)

        self._start(run, "sweep")

    def remedies(self, screen: MessagePump, texts: list[str], settings: Settings, names: list[str]) -> None:
        """Each remedy in `names` measured on `texts`, then all together: `RemediesMeasured`."""

        def run() -> None:
            from ..core.experiments.remedies import compare_remedies

            post_result(
                screen, lambda: compare_remedies(texts, settings, names, self._cancellable_compare()), RemediesMeasured
            )

        self._start(run, "remedies")

    def kernel_classes(self, screen: MessagePump, texts: list[str], settings: Settings) -> None:
        """Which of the batch-invariant mode's classes the difference comes from (`attribute_kernels`):
        `KernelClassesFound`."""

        def run() -> None:
            from ..core.experiments.kernel_classes import attribute_kernels

            plain, compare_fn = (
                settings.with_changes(invariant=False, invariant_classes=""),
                self._cancellable_compare(),
            )
            post_result(screen, lambda: attribute_kernels(texts, plain, compare_fn), KernelClassesFound)

        self._start(run, "remedies")

    @staticmethod
    def _cancellable_compare() -> Callable:
        """For the worker that calls it: `compare(texts, settings)` ended when the worker is cancelled."""
        from ..core.run.engine import compare

        worker = get_current_worker()
        return lambda texts, settings: compare(texts, settings, cancelled=lambda: worker.is_cancelled)
