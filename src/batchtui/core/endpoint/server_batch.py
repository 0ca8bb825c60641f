"""The server's own batch while a level of the ladder runs, where it says (Prometheus metrics at `/metrics`, as vLLM
serves them): the most requests it ran at once and the most it kept waiting. With `--max-num-seqs 16`, a level of
32 in flight is 16 running and 16 queued: the ladder's level is not the server's batch.

A poller thread reads the metrics every `INTERVAL_S` while a round runs (bounded by the round, each read by the
client's deadline and answer limit); a server without them (an error, or neither gauge in the text) is asked once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

INTERVAL_S = 0.05
# vLLM's gauges (summed over engines and models); another server's names can be added here
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
_MAX_SAMPLES = 100_000  # of one round: a bound whatever the round's length


@dataclass(frozen=True)
class ServerBatch:
    running: int  # the most requests the server ran at once
    waiting: int  # the most it kept waiting


def gauges(text: str) -> tuple[int, int] | None:
    """(running, waiting) from Prometheus text, each summed over its series; None without either gauge."""
    found: dict[str, int | None] = {"running": None, "waiting": None}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        kind = "running" if name in RUNNING else "waiting" if name in WAITING else None
        if kind is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        if value == value and 0 <= value < 1e9:  # (a number, a count)
            found[kind] = (found[kind] or 0) + int(value)
    if found["running"] is None and found["waiting"] is None:
        return None
    return found["running"] or 0, found["waiting"] or 0


class BatchPoller:
    """`with poller.polling(): ...` records the server's batch while the block runs; `taken()` the most seen since
    the last `taken()` (None where nothing was read)."""

    def __init__(self, read) -> None:
        self._read = read  # () -> the metrics' text, or None where the server has none
        self.available: bool | None = None  # unknown until the first read
        self._most: tuple[int, int] | None = None

    def polling(self):
        return _Polling(self)

    def sample(self) -> None:
        if self.available is False:
            return
        text = self._read()
        found = None if text is None else gauges(text)
        if self.available is None:
            self.available = found is not None
        if found is not None:
            most = self._most or (0, 0)
            self._most = (max(most[0], found[0]), max(most[1], found[1]))

    def taken(self) -> ServerBatch | None:
        most, self._most = self._most, None
        return None if most is None else ServerBatch(*most)


class _Polling:
    def __init__(self, poller: BatchPoller) -> None:
        self.poller = poller
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="batchtui-metrics", daemon=True)

    def _run(self) -> None:
        for _ in range(_MAX_SAMPLES):
            if self.stop.is_set() or self.poller.available is False:
                return
            self.poller.sample()
            self.stop.wait(INTERVAL_S)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
