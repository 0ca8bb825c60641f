"""Where a command's output goes: the human tables beside a JSON report, and a report's destination checked first."""

from __future__ import annotations

import sys
from typing import TextIO

from ..safe_files import check_writable_file, is_standard_output


def human_output(json_path: str | None) -> TextIO:
    """Where tables and verdicts go: stderr when the JSON report takes stdout (`-`, `/dev/stdout`), so that
    the report stays parseable; stdout otherwise."""
    return sys.stderr if json_path and is_standard_output(json_path) else sys.stdout


def check_report_destination(path: str | None) -> None:
    """Refuse a --json destination that could not be written, before the run rather than after it."""
    if path:
        check_writable_file(path, "cannot write the report to")
