"""The mode's measuring on stderr, while a command's first passes in the mode measure its kernels (`invariant.
measuring`): on a terminal one tqdm line for the phase (kinds measured, the time so far, the kind at hand), left
in place with its total once done; in a log a line when it starts, one every few seconds while it lasts, one when
it is over. Never silent for long: a kind takes a second or two on a large weight."""

from __future__ import annotations

import sys
import time
from typing import Any

from ..invariant.measuring import Measuring
from ..visible import literal

# In a log: a line at most this often while measuring goes on.
LOG_EVERY_S = 2.0


class MeasuringLine:
    def __init__(self) -> None:
        self.on_terminal = sys.stderr.isatty()
        self._bar: Any = None  # tqdm's, on a terminal, while measuring
        self._started: float | None = None  # when this block's measuring began
        self._first = 0  # kinds measured before it
        self._said = 0.0  # when a log line was last printed

    def __call__(self, event: Measuring) -> None:
        if event.notice is not None:
            print(f"batchtui: notice: {literal(event.notice)}", file=sys.stderr)
        elif event.finished:
            self._finish(event)
        else:
            self._measuring(event)

    def _measuring(self, event: Measuring) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started, self._first = now, event.done
        if self.on_terminal:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(
                    desc="measuring the batch-invariant mode's kernels on this machine, once",
                    unit=" kinds", file=sys.stderr, dynamic_ncols=True, leave=True,
                )  # fmt: skip
            self._bar.set_postfix_str(literal(event.what), refresh=False)
            self._bar.update(event.done - self._first - self._bar.n)
            return
        if now - self._said >= LOG_EVERY_S:
            self._said = now
            print(f"batchtui: {literal(event.words())}, {now - self._started:.0f} s so far", file=sys.stderr)

    def _finish(self, event: Measuring) -> None:
        if self._started is None:
            return  # nothing measured in this block
        elapsed = time.monotonic() - self._started
        if self._bar is not None:
            self._bar.update(event.done - self._first - self._bar.n)
            self._bar.set_postfix_str("done, kept for later runs", refresh=False)
            self._bar.close()
            self._bar = None
        else:
            print(f"batchtui: {event.words()} in {elapsed:.0f} s", file=sys.stderr)
        self._started = None
