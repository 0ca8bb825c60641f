"""What the app writes: the session on every edit, reports (ctrl+s, to a path the user confirms) and
screenshots (f8); none ever writes over another file."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..core.reports import session as session_file
from ..core.safe_files import free_name, write_new
from ..core.settings import Settings
from .explorer_state import ExplorerState, RunKey


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
