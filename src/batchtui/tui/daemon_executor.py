"""An executor for the app's thread workers whose threads never hold the process's exit."""

from __future__ import annotations

import atexit
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

# Worker threads still alive. `batchtui` itself leaves with os._exit, but a program that embeds the app
# (tests, scripts) reaches the interpreter's teardown, which must not run beside a forward pass in native
# code (it aborts): there the cancelled workers are waited for, each ending at its next check.
_LIVE: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _wait_for_workers() -> None:
    for thread in list(_LIVE):
        thread.join()


class DaemonThreadExecutor(ThreadPoolExecutor):
    """Each job on a daemon thread of its own, and a shutdown that does not wait.

    Textual runs thread workers on the event loop's default executor, which `asyncio.run` joins on the
    way out: a forward pass that takes 10 s would hold `q` for 10 s. The app saves the session before
    it exits, so an abandoned pass loses nothing. (A ThreadPoolExecutor subclass: asyncio accepts no other.)
    """

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        thread = threading.Thread(target=run, name="batchtui-worker", daemon=True)
        _LIVE.add(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Return at once: a running pass is abandoned, never waited for."""
