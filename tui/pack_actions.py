"""What the app says about where it runs: a repro pack written from ctrl+s (a folder rather than a .json), and the
environment's fingerprint in the status line (I)."""

from __future__ import annotations

from pathlib import Path

from textual import work

from ..core.errors import BatchtuiError
from .engine_calls import call_engine
from .explorer_state import ExplorerState
from .status_line import StatusLine
from .texts_editor import TextsEditor


class PackActions:
    """Mixed into the app; what it reads is the app's `state` and the texts on screen."""

    state: ExplorerState
    endpoint: object | None

    def write_pack_to(self, path: Path) -> None:
        if self.endpoint is not None:
            self.notify("a repro pack holds a local model's logits: over a server, ctrl+s writes a .json report",
                        severity="warning")  # fmt: skip
            return
        from ..core.reports.repro import check_pack_destination

        try:
            check_pack_destination(str(path))
        except BatchtuiError as exc:
            self.notify(str(exc), title="pack not written", severity="error", timeout=10)
            return
        numbered = self.query_one(TextsEditor).numbered()[0]
        self.notify(f"running the texts again to keep their logits for {path}…", title="repro pack")
        self._write_pack(path, numbered.texts, numbered.lines, self.state.settings)

    @work(thread=True, group="pack")
    def _write_pack(self, path: Path, texts: list[str], lines: list[int], settings) -> None:
        from ..core.run.pack import make_pack

        call_engine(
            self,
            lambda: make_pack(path, texts, lines, settings),
            lambda _: self.notify(f"repro pack written to {path.resolve()}", title="pack saved", timeout=10),
            lambda message: self.notify(message, title="pack not written", severity="error", timeout=10),
        )

    def action_show_environment(self) -> None:
        """The fingerprint of this machine, its numerics and the model (hashed once per file) in the status line."""
        self.query_one(StatusLine).set_fingerprint("fingerprint: hashing the model's files…")
        numbered = self.query_one(TextsEditor).numbered()[0]
        self._environment(numbered.texts, self.state.settings)

    @work(thread=True, exclusive=True, group="environment")
    def _environment(self, texts: list[str], settings) -> None:
        from ..core.reports.environment import environment, environment_summary

        served = None
        if self.endpoint is not None:
            served = {"url": self.endpoint.url, "model": self.endpoint.model}  # checked at launch: no credentials
        call_engine(
            self,
            lambda: environment_summary(environment(settings.model, texts, settings.invariant, served)),
            self.query_one(StatusLine).set_fingerprint,
        )
