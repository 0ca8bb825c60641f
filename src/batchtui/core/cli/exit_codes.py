"""What every command shares: its exit codes and the guard that turns failures into one line and a code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..errors import BatchtuiError
from .file_roles import check_files_apart

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
# `bench`: every figure measured, but a speed or memory target missed (not a divergence).
EXIT_TARGET_MISSED = 4
# What a shell reports for a tool stopped by SIGPIPE: the reader of our output went away (`check | head`).
EXIT_BROKEN_PIPE = 128 + 13
# ... and for one stopped by SIGINT (Ctrl+C).
EXIT_INTERRUPTED = 128 + 2


def guarded(body: Callable[[], int]) -> int:
    """Run a command's body: bad input is one line and exit 2, Ctrl+C one line and exit 130, anything else one
    line and exit 3."""
    try:
        code = body()
        sys.stdout.flush()  # here, so that a reader gone away is seen inside the guard
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # a report being written is removed half-done (safe_files), never left behind
        print("batchtui: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BatchtuiError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
        print(error_line(exc, internal=True), file=sys.stderr)
        return EXIT_INTERNAL


def error_line(exc: BaseException, internal: bool = False) -> str:
    """One line for the terminal. Messages quote paths, option values, model names and transformers' words:
    control characters (an escape sequence in a folder's name) are shown as escapes, never sent raw."""
    from ..visible import literal

    text = f"{type(exc).__name__}: {exc}" if internal else str(exc)
    first = text.splitlines()[0] if text.strip() else type(exc).__name__
    return f"batchtui: {'internal error' if internal else 'error'}: {literal(first)}"


def _discard_stdout() -> None:
    """Quietly, as Unix tools do: the interpreter's last flush must not complain about the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def parsed_and_guarded(parser, argv: list[str], body: Callable) -> int:
    """Parse argv (usage errors and --help end here, already printed) and run body(args) guarded, once no file it
    writes is one it reads (`file_roles`)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)

    def checked_body() -> int:
        check_files_apart(args)
        return body(args)

    return guarded(checked_body)
