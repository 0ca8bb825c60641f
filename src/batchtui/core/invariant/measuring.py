"""Who hears what the mode measures while it measures: a first use on a large model measures for minutes inside its
first passes, which must not look like a hang. Listeners are process-wide (the engine's runs take turns:
`core.one_run`), added for a block by whoever shows progress: the CLI's line, the app's status line."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Measuring:
    """One event: `what` is being measured (a kind of call, in words), `done` kinds measured so far in this process
    (this one not yet); `notice`: a line to say once (a measurements file ignored)."""

    what: str
    done: int
    notice: str | None = None
    finished: bool = False  # the mode's block ended: `done` kinds were measured in this process in all

    def words(self) -> str:
        """The event in words, for a progress line or a status line."""
        if self.finished:
            return f"measured {self.done} kinds of call of the batch-invariant mode on this machine (kept for later)"
        return f"measuring the mode's kernels on this machine (once): {self.what}, {self.done} done"


Listener = Callable[[Measuring], None]

_listeners: list[Listener] = []
_lock = threading.Lock()
_done = [0]  # kinds measured in this process


@contextlib.contextmanager
def measuring_reported(listener: Listener) -> Iterator[None]:
    """`listener` hears every measurement made inside the block."""
    listen(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def listen(listener: Listener) -> None:
    """`listener` hears every measurement from now on (a command's, for its whole process)."""
    with _lock:
        _listeners.append(listener)


def say(what: str, notice: str | None = None) -> None:
    """A kind of call is about to be measured (or, with `notice`, something to say once)."""
    with _lock:
        event = Measuring(what, _done[0], notice)
        listeners = list(_listeners)
        if notice is None:
            _done[0] += 1
    for listener in listeners:
        listener(event)


def finished() -> None:
    """A block of the mode ended: listeners that heard measuring in it hear that it is over."""
    with _lock:
        event = Measuring("", _done[0], finished=True)
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)

