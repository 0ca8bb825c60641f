"""Writing the user's files without destroying anything that is not ours.

A regular file is replaced atomically (a reader sees the old or the new content, never half); a symlink
is written through to its target, as editors do; a FIFO or device is written in place, never renamed
over; new files get the mode the umask gives, existing ones keep theirs. Destinations are checked before
the work, so a long run never ends with its results unwritable.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

from .errors import InputError


def umask() -> int:
    """The process's umask, read without changing it where the system allows (another thread may be
    creating files at the same moment)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def is_standard_output(path: str | Path) -> bool:
    """`-`, or a path naming this process's standard output (`/dev/stdout`, `/dev/fd/1`, the file or pipe it
    is): a report there is written to the stream, never renamed over what the stream already holds."""
    if str(path) == "-":
        return True
    try:
        named, stdout = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such path, or stdout closed or replaced
        return False
    return (named.st_dev, named.st_ino) == (stdout.st_dev, stdout.st_ino)


def overlapping(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name the same file or one holds the other: the same resolved path, a path inside the
    other's folder (through symlinks), or the same inode (a hard link, a bind mount). A path that does not exist yet
    is compared by where it would be."""
    real_a, real_b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    if real_a == real_b or real_a in real_b.parents or real_b in real_a.parents:
        return True
    try:
        first, second = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def write_text(path: str | Path, text: str) -> Path:
    """Replace the content of `path` (through a symlink) with `text`; returns the file written."""
    try:
        status = os.stat(path)  # through links: /dev/stdout is the pipe, terminal or file it stands for
    except FileNotFoundError:
        status = None
    if status is not None and not stat.S_ISREG(status.st_mode) and not stat.S_ISDIR(status.st_mode):
        fd = _open_fifo(path) if stat.S_ISFIFO(status.st_mode) else os.open(path, os.O_WRONLY | os.O_TRUNC)
        with open(fd, "w", encoding="utf-8") as handle:  # a FIFO or a device: written like `>` does
            handle.write(text)
        return Path(path)
    target = Path(os.path.realpath(path))
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    mode = stat.S_IMODE(status.st_mode) if status is not None else 0o666 & ~umask()
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def _open_fifo(path: str | Path) -> int:
    """Open a FIFO for writing, waiting for its reader in short sleeps rather than in a blocking open():
    Ctrl+C may be taken by any of the process's threads, and only a sleeping main thread is sure to see it."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def _candidates(directory: Path, stem: str, suffix: str):
    """`stem + suffix`, then `stem-2`, `stem-3`... in `directory`."""
    for number in itertools.count(1):
        yield directory / (f"{stem}{suffix}" if number == 1 else f"{stem}-{number}{suffix}")


def write_new(directory: Path, stem: str, suffix: str, text: str) -> Path:
    """Write `text` to `stem + suffix` in `directory`, or `stem-2`, `stem-3`... : never over an existing
    file, even when two saves come in the same second. The name is claimed first, then filled atomically."""
    names = _candidates(directory, stem, suffix)
    while True:  # (the names never run out)
        try:
            return write_fresh(next(names), text)
        except FileExistsError:
            continue


def free_name(directory: Path, stem: str, suffix: str) -> Path:
    """The name `write_new` would take now: a name to offer the user."""
    return next(path for path in _candidates(directory, stem, suffix) if not os.path.lexists(path))


def write_fresh(path: Path, text: str) -> Path:
    """Write `text` to `path`, which must not exist (FileExistsError otherwise, the file left alone): the
    name is claimed first, then filled atomically."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write_text(path, text)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def check_writable_file(path: str | Path, what: str = "cannot write") -> None:
    """Raise InputError now if `write_text(path)` would fail later ('-' is stdout and always fine)."""
    special = os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)
    if is_standard_output(path) or special:
        return  # the stream, a FIFO or a device: written in place
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise InputError(f"{what} {path}: it is a directory")
    if not target.parent.is_dir():
        raise InputError(f"{what} {path}: folder {target.parent} does not exist")
    if target.exists() and not os.access(target, os.W_OK):
        raise InputError(f"{what} {path}: the file is read-only")
    _check_can_create_in(target.parent, f"{what} {path}")


def check_output_dir(path: str | Path) -> Path:
    """The folder reports go to, created if missing; InputError if it is not a writable folder."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot use output folder {path}: {exc.strerror or exc}") from exc
    _check_can_create_in(folder, f"cannot write reports to {path}")
    return folder.resolve()


def _check_can_create_in(folder: Path, message: str) -> None:
    # os.access says yes to root on a read-only mount and no on some network filesystems: try it.
    try:
        fd, probe = tempfile.mkstemp(prefix=".batchtui-probe-", dir=folder)
    except OSError as exc:
        raise InputError(f"{message}: {exc.strerror or exc}") from exc
    os.close(fd)
    os.unlink(probe)
