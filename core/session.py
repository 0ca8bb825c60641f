"""The app's session file: the user's texts and settings, written atomically after every edit.

Lives under $XDG_STATE_HOME/batchtui/ (default ~/.local/state). A file that cannot be read back is
set aside (renamed with a .corrupt suffix) rather than lost or fatal.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .settings import Settings

VERSION = 1


def default_session_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "batchtui" / "session.json"


@dataclass
class Session:
    texts: list[str]
    settings: Settings


@dataclass
class Loaded:
    session: Session | None
    notice: str | None  # what the user should be told (a corrupt file set aside), if anything


def save(path: Path, texts_source: str, settings: Settings) -> None:
    """Atomic: a temp file in the same folder, then rename. A kill at any moment leaves old or new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": VERSION, "saved_at": time.time(), "text": texts_source, "settings": asdict(settings)}
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, ensure_ascii=False)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def load(path: Path) -> Loaded:
    if not path.exists():
        return Loaded(None, None)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        text = data["text"]
        known = {f.name for f in fields(Settings)}
        settings = Settings(**{k: v for k, v in data["settings"].items() if k in known}).validated()
        if not isinstance(text, str):
            raise TypeError("text is not a string")
    except Exception as exc:  # noqa: BLE001 - any damage: set the file aside, never crash
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            path.replace(aside)
        except OSError:
            aside = path
        return Loaded(None, f"session file was unreadable ({type(exc).__name__}); set aside as {aside}")
    return Loaded(Session(text.split("\n"), settings), None)
