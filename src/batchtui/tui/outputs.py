"""What the app writes: the session on every edit, reports and repro packs (ctrl+s, to a path the user confirms),
screenshots (f8), and the machine's fingerprint it shows; none ever writes over another file."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..core.reports import session as session_file
from ..core.safe_files import free_name, write_new
from ..core.settings import Settings
from .explorer_state import ExplorerState, RunKey
from .run_controller import RunController


class SessionSaver:
    """Saves the session; a failure (a read-only state folder) is said once, not on every keystroke,
    and a later success says so. The app works on either way."""

    def __init__(self, notify: Callable[..., None]) -> None:
        self._notify = notify
        self._failing = False

    def save(self, path: Path, texts_source: str, settings: Settings) -> None:
        try:
            session_file.save(path, texts_source, settings)
        except OSError as exc:
            if not self._failing:
                self._notify(
                    f"cannot save the session to {path} ({exc.strerror or exc}): edits are kept on screen "
                    "but not on disk; ctrl+s still writes reports to the output folder",
                    severity="error",
                    timeout=20,
                )
            self._failing = True
        else:
            if self._failing:
                self._notify(f"session saved again to {path}")
            self._failing = False


def report_on_screen(state: ExplorerState, key: RunKey, served: bool) -> dict | None:
    """The comparison on screen with the generation, sweep and remedies run from it; over a server, its
    continuations (None: nothing yet)."""
    if served:
        from ..core.endpoint.report import endpoint_json

        result = state.generation_on_screen
        return None if result is None else endpoint_json(result)
    if state.comparison is None:
        return None
    from ..core.reports.explorer import explorer_report

    return explorer_report(state.comparison, state.generation_on_screen, state.sweep_for(key), state.remedies_for(key))


def offered_report_path(output_dir: Path) -> Path:
    """A fresh name for ctrl+s to offer: nothing is ever written over."""
    return free_name(output_dir, f"batchtui-report-{time.strftime('%Y%m%d-%H%M%S')}", ".json")


def write_report(report: dict, path: Path, served: bool) -> tuple[bool, str]:
    """Write `report` to a new file at `path`: (written, what to say)."""
    from ..core.reports.explorer import sections
    from ..core.reports.report import write_fresh_json

    try:
        write_fresh_json(report, path)
    except FileExistsError:
        return False, f"{path} exists: a report never overwrites a file, give another name"
    except OSError as exc:
        return False, f"cannot write {path}: {exc.strerror or exc}"
    what = "served continuations" if served else ", ".join(sections(report))
    return True, f"{what} written to {path.resolve()}"


def write_screenshot(output_dir: Path, svg: str) -> tuple[bool, str]:
    """f8: the screen as SVG under a fresh name in the output folder: (written, what to say)."""
    try:
        path = write_new(output_dir, f"batchtui-screenshot-{time.strftime('%Y%m%d-%H%M%S')}", ".svg", svg)
    except OSError as exc:
        return False, f"cannot save a screenshot in {output_dir}: {exc.strerror or exc}"
    return True, f"screenshot saved to {path}"


class OutputsHost(Protocol):
    """What `AppOutputs` reads of the app that owns it (the app is one: `BatchtuiApp`)."""

    endpoint: Any
    state: ExplorerState
    runs: RunController
    output_dir: Path

    def notify(self, message: str, **kwargs: Any) -> None: ...
    def push_screen(self, screen: Any, callback: Any = None) -> Any: ...
    def show_status(self, **changes: Any) -> None: ...
    def export_screenshot(self) -> str: ...
    def on_screen_key(self) -> RunKey: ...


class AppOutputs:
    """The app's outputs, owned by the app as its `RunController` is: the report on screen saved (ctrl+s) as JSON or,
    to a folder, as a repro pack run again for its logits; a screenshot (f8); the fingerprint (e). It reads what is
    on screen from the app's state and says what it did in a notification."""

    def __init__(self, app: OutputsHost) -> None:
        self._app = app

    @property
    def _served(self) -> bool:
        return self._app.endpoint is not None

    def report_on_screen(self) -> dict | None:
        return report_on_screen(self._app.state, self._app.on_screen_key(), served=self._served)

    def offer_report(self) -> None:
        """ctrl+s: a prompt for where the report (or a pack) goes, offering a fresh name in the output folder."""
        from .screens.prompt_screen import PromptScreen

        if self.report_on_screen() is None:
            self._app.notify("no comparison to save yet", severity="warning")
            return
        hint = "a new .json file, or a new folder for a repro pack with the logits (nothing is ever overwritten) · "
        prompt = PromptScreen("save the report to", str(offered_report_path(self._app.output_dir)), hint)
        self._app.push_screen(prompt, self._save_report_to)

    def _save_report_to(self, answer: str | None) -> None:
        if not answer:
            return
        path = Path(answer).expanduser()
        if path.suffix.lower() != ".json":
            self._write_pack_to(path)
            return
        written, said = write_report(self.report_on_screen(), path, served=self._served)
        if written:
            self._app.notify(said, title="report saved", timeout=10)
        else:
            self._app.notify(said, title="report not written", severity="error", timeout=10)

    def _write_pack_to(self, path: Path) -> None:
        from ..core.errors import BatchtuiError
        from ..core.reports.pack_writer import check_pack_destination

        if self._served:
            self._app.notify("a repro pack holds a local model's logits: over a server, ctrl+s writes a .json report",
                             severity="warning")  # fmt: skip
            return
        try:
            check_pack_destination(str(path))
        except BatchtuiError as exc:
            self._app.notify(str(exc), title="pack not written", severity="error", timeout=10)
            return
        self._app.notify(f"running the texts again to keep their logits for {path}…", title="repro pack")
        self._app.runs.write_pack(path, self._app.state.texts, self._app.state.settings)

    def pack_written(self, path: Path) -> None:
        self._app.notify(f"repro pack written to {path.resolve()}", title="pack saved", timeout=10)

    def fingerprint(self) -> None:
        """The fingerprint of this machine, its numerics and the model (hashed once per file): whole in a
        notification (it wraps at any width), and in the status line where it fits (F1 shows the line whole)."""
        self._app.show_status(fingerprint="fingerprint: hashing the model's files…")
        self._app.runs.fingerprint(self._app.state.texts.texts, self._app.state.settings)

    def fingerprint_ready(self, summary: str) -> None:
        self._app.show_status(fingerprint=summary)
        self._app.notify(summary, title="fingerprint", timeout=20)

    def screenshot(self) -> None:
        written, said = write_screenshot(self._app.output_dir, self._app.export_screenshot())
        self._app.notify(said, title="saved") if written else self._app.notify(said, severity="error")
