"""What the app writes: the session on every edit, reports (ctrl+s) and screenshots (f8)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..core import session as session_file
from ..core.safe_files import write_new
from ..core.settings import Settings


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
    """The app's ctrl+s and f8: files under fresh names in the output folder, never over another one."""

    output_dir: Path

    def action_save_report(self) -> None:
        if self.comparison is None:
            self.notify("no comparison to save yet", severity="warning")
            return
        from ..core.report import to_json_dict, write_new_json

        stem = f"batchtui-report-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            path = write_new_json(to_json_dict(self.comparison), self.output_dir, stem)
        except OSError as exc:
            self.notify(f"cannot write a report in {self.output_dir}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"report written to {path}", title="saved")

    def action_screenshot(self) -> None:
        stem = f"batchtui-screenshot-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            path = write_new(self.output_dir, stem, ".svg", self.export_screenshot())
        except OSError as exc:
            self.notify(f"cannot save a screenshot in {self.output_dir}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"screenshot saved to {path}", title="saved")
