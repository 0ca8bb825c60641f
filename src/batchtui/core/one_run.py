"""One engine run at a time in a process.

Runs share the loaded model and its tokenizer, and the batch-invariant mode's entry and exit register and remove
aten kernels process-wide. PyTorch reads its dispatch tables without a lock: a kernel removed while another
thread's call is dispatched can send that call to freed or foreign code (seen: a plain run's matrix product
reaching the mode's batched-product replacement). The app starts a newer run while an older, cancelled one
finishes; the newer waits here for the older to stop, at its next pass at most (its next cancellation check)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

_lock = threading.RLock()  # re-entrant: a run loads a model, and a comparison may look for first ops in it


@contextlib.contextmanager
def one_run_at_a_time(waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Held while a run loads a model or runs passes; a second thread's run waits until the first is done, calling
    `waiting()` first (the app says so rather than seem to load the model)."""
    if not _lock.acquire(blocking=False):
        if waiting is not None:
            waiting()
        _lock.acquire()
    try:
        yield
    finally:
        _lock.release()
