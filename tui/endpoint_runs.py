"""The app over a served model (`batchtui --url`): each run completes the texts on the server alone and under load
in a thread worker and shows them in the generation view; the panes and settings of local passes are hidden."""

from __future__ import annotations

from dataclasses import dataclass

from textual import work
from textual.worker import get_current_worker

from ..core.endpoint.report import endpoint_verdict
from ..core.endpoint.result import EndpointComparison
from ..core.texts import NumberedTexts
from .engine_calls import post_outcome
from .explorer_state import ExplorerState
from .generation_pane import GenerationPane
from .messages import EndpointReady, RunFailed, RunProgress
from .status_line import StatusLine


@dataclass(frozen=True)
class EndpointTarget:
    """The server the app asks: its address, the model (None: the only one it serves), the API key's variable."""

    url: str
    model: str | None = None
    api_key_env: str | None = None


# Keys that change or show a local model's passes: a server's dtype, batch and kernels are its own.
LOCAL_ONLY_ACTIONS = frozenset(
    {
        "cycle_dtype",
        "toggle_padding",
        "cycle_batch_size",
        "toggle_positions",
        "cycle_attention",
        "toggle_invariant",
        "toggle_layers",
        "toggle_module_view",
        "toggle_topk",
        "toggle_generation",
        "switch_model",
        "remedies",
        "sweep",
        "next_divergent",
        "previous_divergent",
        "next_flip",
        "previous_flip",
        "worst_flip",
        "cycle_summary_order",
    }
)


class EndpointRuns:
    """Mixed into the app; what it reads and changes is the app's `state`."""

    state: ExplorerState
    endpoint: EndpointTarget | None

    def start_endpoint_run(self, numbered: NumberedTexts, run_number: int) -> None:
        self.query_one(GenerationPane).waiting("asking the server: each text alone twice, then all under load…")
        self._measure_endpoint(numbered, run_number)

    @work(thread=True, exclusive=True, group="endpoint")
    def _measure_endpoint(self, numbered: NumberedTexts, run_number: int) -> None:
        worker = get_current_worker()
        target = self.endpoint

        def stale() -> bool:
            return worker.is_cancelled or not self.state.is_current(run_number)

        def run() -> EndpointComparison:
            from ..core.endpoint.client import Endpoint
            from ..core.endpoint.run import measure_endpoint

            self.post_message(RunProgress(run_number, f"asking {target.url} for its models"))
            endpoint = Endpoint(target.url, target.model, target.api_key_env)
            try:
                model = endpoint.resolve_model()

                def progress(done: int, total: int) -> None:
                    self.post_message(RunProgress(run_number, f"requests {done}/{total}"))

                config = {"url": endpoint.url, "model": model}
                return measure_endpoint(
                    endpoint, numbered.texts, numbered.lines, config=config, progress=progress, cancelled=stale
                )
            finally:
                endpoint.close()

        post_outcome(self, run_number, run, EndpointReady, RunFailed)

    def on_endpoint_ready(self, message: EndpointReady) -> None:
        if not self.shows_run(message.run_number):
            return
        result = message.result
        self.state.settle(message.run_number)
        self.state.keep_generation(message.run_number, result)
        status = self.query_one(StatusLine)
        status.end_run()
        status.set_activity(endpoint_verdict(result))
        status.set_last_run(result.elapsed_s)
        if result.failure is None:
            status.clear_error()
        else:  # what was measured before the fault stays on screen
            status.set_error(result.failure)
            self.notify(result.failure, title="the server failed", severity="error", timeout=10)
        for note in result.notes:
            self.notify(note, severity="warning")
        self.state.selected = (min(self.state.selected[0], len(result.texts) - 1), 0)
        self.query_one(GenerationPane).show(result, self.state.selected[0])
