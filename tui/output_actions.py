"""What the app writes: the session on every edit, reports (ctrl+s, to a path the user confirms) and
screenshots (f8)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..core.reports import session as session_file
from ..core.safe_files import free_name, write_new
from ..core.settings import Settings
from .prompt_screen import PromptScreen


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


class OutputActions:
    """The app's ctrl+s and f8: ctrl+s asks where (a fresh name in the output folder offered), f8 writes
    under a fresh name; neither ever writes over another file."""

    output_dir: Path
    endpoint: object | None  # `--url`: the report is the served model's continuations

    def report_on_screen(self) -> dict | None:
        """The comparison on screen with the generation, sweep and remedies run from it; a served model's
        continuations (None: nothing yet)."""
        if self.endpoint is not None:
            from ..core.endpoint.report import endpoint_json

            served = self.state.generation_on_screen
            return None if served is None else endpoint_json(served)
        if self.state.comparison is None:
            return None
        from ..core.reports.explorer import explorer_report

        key = self.on_screen_key()
        state = self.state
        return explorer_report(
            state.comparison, state.generation_on_screen, state.sweep_for(key), state.remedies_for(key)
        )

    def action_save_report(self) -> None:
        if self.report_on_screen() is None:
            self.notify("no comparison to save yet", severity="warning")
            return
        offered = free_name(self.output_dir, f"batchtui-report-{time.strftime('%Y%m%d-%H%M%S')}", ".json")
        hint = "a new .json file, or a new folder for a repro pack with the logits (nothing is ever overwritten) · "
        self.push_screen(PromptScreen("save the report to", str(offered), hint), self._save_report_to)

    def _save_report_to(self, answer: str | None) -> None:
        if not answer:
            return
        from ..core.reports.explorer import sections
        from ..core.reports.report import write_fresh_json

        path = Path(os.path.expanduser(answer))
        if path.suffix.lower() != ".json":
            self.write_pack_to(path)
            return
        report = self.report_on_screen()
        try:
            write_fresh_json(report, path)
        except FileExistsError:
            problem = f"{path} exists: a report never overwrites a file, give another name"
        except OSError as exc:
            problem = f"cannot write {path}: {exc.strerror or exc}"
        else:
            what = "served continuations" if self.endpoint is not None else ", ".join(sections(report))
            self.notify(f"{what} written to {path.resolve()}", title="report saved", timeout=10)
            return
        self.notify(problem, title="report not written", severity="error", timeout=10)

    def action_screenshot(self) -> None:
        stem = f"batchtui-screenshot-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            path = write_new(self.output_dir, stem, ".svg", self.export_screenshot())
        except OSError as exc:
            self.notify(f"cannot save a screenshot in {self.output_dir}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"screenshot saved to {path}", title="saved")
