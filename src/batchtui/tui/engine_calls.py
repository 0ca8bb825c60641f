"""Calling the engine from a thread worker: its result or its failure posted as a message, never a crash."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from textual.app import App
from textual.message import Message
from textual.message_pump import MessagePump

from ..core.errors import BatchtuiError, Cancelled
from .messages import EngineFailed


def failure_message(exc: BaseException) -> str:
    """The engine's own one-line message, or the exception's type and text for anything unforeseen."""
    return str(exc) if isinstance(exc, BatchtuiError) else f"{type(exc).__name__}: {exc}"


def post_result(
    owner: MessagePump,
    work: Callable[[], object],
    ready: Callable[[Any], Message],
    failed: Callable[[str], Message] = EngineFailed,
) -> None:
    """Run `work` (in the calling worker thread) and post `ready(result)` to `owner`, or `failed(message)` with the
    failure's one line; a cancelled run posts nothing. A closed owner takes no message: a worker that outlives its
    screen ends without a word."""
    try:
        result = work()
    except Cancelled:
        return
    except Exception as exc:  # noqa: BLE001 - the app must survive anything the engine raises
        owner.post_message(failed(failure_message(exc)))
        return
    owner.post_message(ready(result))


def post_outcome(app: App, run_number: int, work: Callable[[], object], ready, failed) -> None:
    """`post_result` for a numbered run: `ready(run_number, result)` or `failed(run_number, message)`."""
    post_result(app, work, partial(ready, run_number), partial(failed, run_number))
