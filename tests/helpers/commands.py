"""Starting a command as a user's shell does, for tests that interrupt it."""

from __future__ import annotations

import signal
import subprocess


def _signals_as_a_shell_leaves_them() -> None:
    # pytest-xdist's workers ignore SIGINT and SIGQUIT, and an ignored signal is inherited through exec: Python
    # would then never raise KeyboardInterrupt in the command, and Ctrl+C would do nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def start(command: list[str], **popen_args) -> subprocess.Popen:
    """Popen with SIGINT and SIGQUIT at their defaults, whatever the test process does with them."""
    return subprocess.Popen(command, preexec_fn=_signals_as_a_shell_leaves_them, **popen_args)
