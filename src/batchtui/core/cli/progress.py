"""How every command says how far it has got, on stderr: one class for all of them."""

from __future__ import annotations

import sys
import time
from typing import Any

DELAY_S = 2.0  # a run done sooner says nothing: progress is for the runs one waits on
_PLAIN_LINES = 10  # a log gets a line each tenth of the way
_PLAIN_EVERY = 1000  # ... or, without a total, each this many


class Progress:
    """tqdm's bar on a terminal (done/total, what ran last, the time so far and left, fitted to its width); in a log
    about ten plain lines; nothing with `quiet`, nor for a run done within `DELAY_S`. Called as `progress(done,
    total, label)`: a total of None counts without an end; a new total, or a count that goes back, starts again.
    A context manager: the bar goes on exit."""

    def __init__(self, quiet: bool = False, unit: str = "it", leave: bool = False) -> None:
        self.quiet = quiet
        self.unit = unit
        self.leave = leave
        self.terminal = not quiet and sys.stderr.isatty()
        self.total: int | None = 0  # the last total said (a stopped run's message reads it)
        self._started = time.monotonic()
        self._bar: Any = None  # tqdm's, once shown
        self._said = -1  # the last tenth (or thousand) a plain line said

    def __call__(self, done: int, total: int | None, label: str | None = None) -> None:
        if total != self.total or (self._bar is not None and done < self._bar.n):
            self.close()
            self._said = -1
        self.total = total
        if self.quiet:
            return
        if self.terminal:
            self._tqdm(done, total, label)
        elif time.monotonic() - self._started >= DELAY_S:
            self._plain(done, total, label)

    def _tqdm(self, done: int, total: int | None, label: str | None) -> None:
        if self._bar is None:
            from tqdm import tqdm

            wait = max(0.0, DELAY_S - (time.monotonic() - self._started))
            self._bar = tqdm(total=total, initial=done, unit=self.unit, file=sys.stderr, dynamic_ncols=True,
                             leave=self.leave, delay=wait)  # fmt: skip
        if label is not None:
            self._bar.set_description_str(label, refresh=False)
        self._bar.update(done - self._bar.n)

    def _plain(self, done: int, total: int | None, label: str | None) -> None:
        step = done * _PLAIN_LINES // total if total else done // _PLAIN_EVERY
        if step == self._said and done != total:
            return
        self._said = step
        elapsed = time.monotonic() - self._started
        what = f" {label}" if label else ""
        if not total:
            print(f"{done} {self.unit}{what} · {elapsed:.0f} s", file=sys.stderr)
            return
        width = 24
        filled = width * done // total
        left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
        print(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}{what} · {elapsed:.0f} s{left}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
