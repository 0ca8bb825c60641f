"""The app's session file: the user's texts and settings, written atomically after every edit.

Lives under $XDG_STATE_HOME/batchtui/ (default ~/.local/state). Only a file batchtui wrote is ever
replaced: a folder, a device, a FIFO or another program's file is refused before anything is written,
and only a damaged file of ours is set aside (renamed `.corrupt-<time>`). A symlink is written through
to its target. A lock file beside it keeps a second app from writing over the first one's edits.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TextIO

from ..errors import InputError
from ..safe_files import write_text
from ..settings import Settings
from ..visible import literal

VERSION = 1
# Every session file we write starts so; a file that does and no longer parses is ours, damaged.
_OUR_PREFIX = b'{"version":'
# Session files hold texts typed by hand; anything larger is not one of ours.
_MAX_BYTES = 256 * 2**20


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
    notice: str | None  # what the user should be told (a damaged file set aside, values dropped), if anything


def save(path: Path, texts_source: str, settings: Settings) -> None:
    """Atomic: a temp file in the same folder, then rename. A kill at any moment leaves old or new."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": VERSION, "saved_at": time.time(), "text": texts_source, "settings": asdict(settings)}
    # ASCII escapes: a text holding a lone surrogate (a paste of broken bytes) is saved, not a crash.
    write_text(target, json.dumps(data, ensure_ascii=True))


def load(path: Path, set_aside: bool = True) -> Loaded:
    """The session at `path`; InputError (nothing touched) if `path` is not a session file batchtui may use. A
    damaged file of ours is renamed `.corrupt-<time>` only with `set_aside` (an app that will start)."""
    raw = _read_if_ours_to_use(path)
    if not raw.strip():
        return Loaded(None, None)  # missing or empty: a new session
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # undecodable, not JSON, or nested past the parser's depth
        if not raw.lstrip().startswith(_OUR_PREFIX):
            raise _foreign(path) from exc
        return Loaded(None, _set_aside(path, exc, set_aside))
    if not (isinstance(data, dict) and "version" in data and {"text", "settings"} <= data.keys()):
        raise _foreign(path)
    if not isinstance(data["version"], int) or data["version"] > VERSION:
        raise InputError(f"session file {path} was written by a newer batchtui; pass another --session")
    if not isinstance(data["text"], str) or not isinstance(data["settings"], dict):
        return Loaded(None, _set_aside(path, TypeError("text or settings of the wrong type"), set_aside))
    settings, dropped = _restored_settings(data["settings"])
    notice = None
    if dropped:
        notice = f"session settings set aside as unusable, defaults used instead: {', '.join(dropped)}"
    return Loaded(Session(data["text"].split("\n"), settings), notice)


def _read_if_ours_to_use(path: Path) -> bytes:
    """The file's bytes (b'' if it does not exist yet), or InputError if it is not a regular file."""
    try:
        status = os.stat(path)  # through a symlink: its target is what is read and written
    except (FileNotFoundError, NotADirectoryError):  # (a file where a folder of the path should be: none to read,
        return b""  # and the app says once that it cannot save)
    except OSError as exc:
        raise InputError(f"cannot use session file {path}: {exc.strerror or exc}") from exc
    if stat.S_ISDIR(status.st_mode):
        raise InputError(f"session file {path} is a directory; pass a file path to --session")
    if not stat.S_ISREG(status.st_mode):
        raise InputError(f"session file {path} is not a regular file (a device, FIFO or socket); refusing to use it")
    if status.st_size > _MAX_BYTES:
        raise _foreign(path)
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read session file {path}: {exc.strerror or exc}") from exc


def _foreign(path: Path) -> InputError:
    return InputError(f"{path} is not a batchtui session file; refusing to overwrite it (pass another --session)")


def _set_aside(path: Path, exc: BaseException, rename: bool = True) -> str:
    if not rename:
        return f"session file is unreadable ({type(exc).__name__}); left as it is"
    target = Path(os.path.realpath(path))
    aside = target.with_name(f"{target.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    for number in range(2, 1000):
        if not aside.exists():
            break
        aside = target.with_name(f"{target.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{number}")
    try:
        target.rename(aside)
    except OSError:
        aside = target
    return f"session file was unreadable ({type(exc).__name__}); set aside as {aside}"


def _restored_settings(saved: dict) -> tuple[Settings, list[str]]:
    """The saved settings one by one: a value that does not validate is dropped, the rest are kept."""
    settings = Settings()
    dropped = []
    for field in fields(Settings):
        if field.name not in saved:
            continue
        value = saved[field.name]
        try:
            settings = settings.with_changes(**{field.name: value}).validated()
        except (InputError, TypeError, ValueError):
            dropped.append(f"{field.name}={_short(value)}")
    return settings, dropped


def _short(value) -> str:
    """A dropped value as the notice names it: a scalar as written (cut), a container by its type alone."""
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__}>"
    return literal(repr(value), 40)


class SessionLock:
    """Held while an app uses a session file, so that a second app on the same file is refused at start.

    An advisory lock (flock) on `<session>.lock`: the system drops it when the process ends, even by
    SIGKILL, so a crash never leaves the session locked. A session file with a second name (a hard link)
    is refused: the lock is named after one of its names, and the other would take a lock of its own.
    """

    def __init__(self, path: Path) -> None:
        target = Path(os.path.realpath(path))
        self.path = target.with_name(f"{target.name}.lock")
        self._handle: TextIO | None = None

    def acquire(self) -> bool:
        """Take the lock: True if held, False where locks cannot be taken here (a read-only folder);
        InputError if another app holds it."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            names = os.stat(self.path.with_suffix("")).st_nlink
            if names > 1:
                raise InputError(
                    f"session file {self.path.with_suffix('')} has {names} names (hard links), so two apps could "
                    "write it at once; pass a session file of its own with --session"
                )
        try:
            import fcntl
        except ImportError:  # no flock on this system
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the app runs
        except OSError:
            return False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise InputError(
                f"session file {self.path.with_suffix('')} is in use by another batchtui (pid {holder}); "
                "quit that one, or pass --session FILE to run a second app"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None
