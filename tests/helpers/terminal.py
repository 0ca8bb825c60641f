"""Driving the real app in a pseudo-terminal: start it, wait on conditions while reading its output."""

from __future__ import annotations

import os
import pty
import select
import sys
import time


def start_app(args: list[str], python_args: tuple[str, ...] = ("-m", "batchtui.tui")) -> tuple[int, int]:
    """`python -m batchtui.tui ARGS` in a new pseudo-terminal: (pid, the terminal's fd)."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app itself
        os.execvpe(sys.executable, [sys.executable, *python_args, *args], env)
    return pid, fd


def wait_for(condition, fd, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drain(fd)
        try:
            if condition():
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def pause(fd, seconds: float) -> None:
    """Wait while reading the app's output: a full terminal buffer would block the app."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        drain(fd)
        time.sleep(0.005)


def drain(fd) -> None:
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            OUTPUT.setdefault(fd, bytearray()).extend(chunk)
        except OSError:
            return


# Everything each terminal has shown so far, by fd: tests look for what must never reach a terminal.
OUTPUT: dict[int, bytearray] = {}


def wait_exit(pid: int, fd: int, timeout: float) -> tuple[int | None, float]:
    """Wait for the app to end while reading its output: (its wait status or None, seconds waited)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        drain(fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, time.monotonic() - started
        time.sleep(0.01)
    return None, time.monotonic() - started
