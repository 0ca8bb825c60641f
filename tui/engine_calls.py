"""Calling the engine from a thread worker: a result for the UI thread, or a message, never a crash."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App

from ..core.errors import BatchtuiError, Cancelled


def failure_message(exc: BaseException) -> str:
    """The engine's own one-line message, or the exception's type and text for anything unforeseen."""
    return str(exc) if isinstance(exc, BatchtuiError) else f"{type(exc).__name__}: {exc}"


def call_engine(app: App, work: Callable[[], object], on_result: Callable[[object], None]) -> None:
    """Run `work` (in the calling worker thread); hand its result to `on_result` on the UI thread.

    A cancelled run ends silently; any failure becomes an error notification and the app carries on.
    """
    try:
        result = work()
    except Cancelled:
        return
    except Exception as exc:  # noqa: BLE001 - the app must survive anything the engine raises
        app.call_from_thread(app.notify, failure_message(exc), severity="error", markup=False)
        return
    app.call_from_thread(on_result, result)


def post_outcome(app: App, generation: int, work: Callable[[], object], ready, failed) -> None:
    """Run `work` (in the calling worker thread) and post `ready(generation, result)` to the app, or
    `failed(generation, message)`; a cancelled (stale) run posts nothing."""
    try:
        result = work()
    except Cancelled:
        return
    except Exception as exc:  # noqa: BLE001 - the app must survive anything the engine raises
        app.post_message(failed(generation, failure_message(exc)))
        return
    app.post_message(ready(generation, result))
