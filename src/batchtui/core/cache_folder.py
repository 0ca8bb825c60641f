"""Where batchtui keeps what it can rebuild (built-in models, file hashes): `$XDG_CACHE_HOME/batchtui`, or, when
that cannot be a folder, a temporary one for this run, with a notice; never a failed run."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path


def cache_folder() -> Path:
    return _resolved(_base())[0]


def cache_notice() -> str | None:
    """One line for the user when the cache folder could not be used (None when it could)."""
    return _resolved(_base())[1]


def _base() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


@functools.cache  # per base: one temporary folder a run, not one a call
def _resolved(base: str) -> tuple[Path, str | None]:
    folder = Path(base) / "batchtui"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder, None
    except OSError as exc:
        temporary = Path(tempfile.mkdtemp(prefix="batchtui-cache-"))
        reason = exc.strerror or type(exc).__name__
        return temporary, f"cache folder {folder} cannot be used ({reason}): using {temporary} for this run"
