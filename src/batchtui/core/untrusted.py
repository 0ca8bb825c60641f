"""What others send (a repro pack, a report given to `diff`, a cache): read bounded, then checked field by field.

Files are opened without waiting (a FIFO or a device is refused at once, never read), must be regular files,
and are read up to a cap per kind. The field checks turn every wrong type into one `InputError` line naming
the file and the field, so nothing downstream meets a value of a type it did not expect.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from .errors import InputError

MiB = 2**20


def open_regular(path: str | Path, what: str, writable: bool = False, links: bool = True):
    """Regular file `path` opened for binary reading (and writing, with `writable`) without waiting: a FIFO or a
    device is refused at once, never read; InputError for anything but a regular file (`what` names it), and
    without `links` for a symbolic link (a file inside something sent must not reach outside it)."""
    try:
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
        fd = os.open(path, flags if links else flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise InputError(f"{what} {path}: no such file") from None
    except OSError as exc:
        if not links and os.path.islink(path):
            raise InputError(f"{what} {path} is a symbolic link: not followed") from None
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # (before fdopen, which refuses a folder with IsADirectoryError)
        os.close(fd)
        raise InputError(f"{what} {path} is not a regular file (a folder, FIFO, device or socket): not read")
    return os.fdopen(fd, "r+b" if writable else "rb")


def read_capped(path: str | Path, cap: int, what: str, links: bool = True) -> bytes:
    """The bytes of regular file `path`, at most `cap` of them; InputError for anything else (and without
    `links`, for a symbolic link)."""
    with open_regular(path, what, links=links) as handle:
        status = os.fstat(handle.fileno())
        if status.st_size > cap:
            raise InputError(f"{what} {path} is {status.st_size / MiB:.1f} MiB, over the {_size(cap)} limit")
        data = handle.read(cap + 1)
    if len(data) > cap:  # it grew while being read
        raise InputError(f"{what} {path} is over the {_size(cap)} limit")
    return data


def read_json(path: str | Path, cap: int, what: str, links: bool = True) -> object:
    """The JSON value in regular file `path` (at most `cap` bytes of UTF-8; without `links`, not a symlink)."""
    data = read_capped(path, cap, what, links)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{what} {path} is not JSON (or nested too deep)") from None


def _size(cap: int) -> str:
    return f"{cap // MiB} MiB" if cap >= MiB else f"{cap} bytes"


_KINDS = {
    "string": lambda v: isinstance(v, str),
    "whole number": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "true or false": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v),
    "list": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def finite(value: int | float) -> bool:
    """A finite float, or an integer one converts to (a 400-digit integer does not: OverflowError downstream)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _type_name(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not finite(value):
        return "a number no float holds (past its range, infinite or NaN)"
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def check(value: object, kind: str, where: str, optional: bool = False) -> Any:
    """`value` if it is of `kind` (a key of _KINDS; None too when `optional`), else InputError at `where`. Typed
    `Any`: what comes back is of the kind asked for, which the caller names."""
    if value is None and optional:
        return value
    if not _KINDS[kind](value):
        article = "an" if kind[0] in "aeiou" else "a"
        raise InputError(f"{where} must be {article} {kind}{' or null' if optional else ''}, not {_type_name(value)}")
    return value


def field(obj: dict, key: str, kind: str, where: str, optional: bool = False) -> Any:
    """`obj[key]` checked as `kind`; a missing key is an error unless `optional` (then None)."""
    if key not in obj and not optional:
        raise InputError(f"{where} has no {key!r}")
    return check(obj.get(key), kind, f"{where}: {key!r}", optional)


def list_of(value: object, kind: str, where: str) -> list:
    """`value` as a list whose every item is of `kind`."""
    items: list = check(value, "list", where)
    for index, item in enumerate(items):
        check(item, kind, f"{where}[{index}]")
    return items
