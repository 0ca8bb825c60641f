"""Calling the engine from a thread worker: a result for the UI thread, or a message, never a crash."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.app import App
from textual.message_pump import MessagePump

from ..core.errors import BatchtuiError, Cancelled


def failure_message(exc: BaseException) -> str:
    """The engine's own one-line message, or the exception's type and text for anything unforeseen."""
    return str(exc) if isinstance(exc, BatchtuiError) else f"{type(exc).__name__}: {exc}"


def on_ui_thread(owner: MessagePump, callback: Callable[..., object], *args: object) -> None:
    """Run `callback(*args)` on the UI thread, unless `owner` (the app, or a screen) has begun to close: its
    widgets may already be gone, and a worker that outlives them ends without a word."""

    def still_open() -> bool:
        return owner.is_running and owner.app.is_running

    def deliver() -> None:
        if still_open():  # checked again on the UI thread: the owner may have closed while this waited
            callback(*args)

    if not still_open():
        return  # a closed app's loop may never run what is handed to it: the worker would wait for ever
    try:
        owner.app.call_from_thread(deliver)
    except RuntimeError:  # the app's loop closed after the check above
        if owner.app.is_running:
            raise


def call_engine(
    owner: MessagePump,
    work: Callable[[], object],
    on_result: Callable[[object], None],
    on_failure: Callable[[str], None] | None = None,
) -> None:
    """Run `work` (in the calling worker thread); hand its result to `on_result` on the UI thread.

    A cancelled run ends silently; any failure goes to `on_failure` (default: an error notification)
    with its one-line message, and the app carries on.
    """
    try:
        result = work()
    except Cancelled:
        return
    except Exception as exc:  # noqa: BLE001 - the app must survive anything the engine raises
        if on_failure is None:
            on_ui_thread(owner, partial(owner.app.notify, severity="error", markup=False), failure_message(exc))
        else:
            on_ui_thread(owner, on_failure, failure_message(exc))
        return
    on_ui_thread(owner, on_result, result)


def post_outcome(app: App, run_number: int, work: Callable[[], object], ready, failed) -> None:
    """Run `work` (in the calling worker thread) and post `ready(run_number, result)` to the app, or
    `failed(run_number, message)`; a cancelled (stale) run posts nothing."""
    try:
        result = work()
    except Cancelled:
        return
    except Exception as exc:  # noqa: BLE001 - the app must survive anything the engine raises
        app.post_message(failed(run_number, failure_message(exc)))
        return
    app.post_message(ready(run_number, result))
