"""Nothing lost: the session file is written on every edit, restored on start, set aside when corrupt."""

import json
import os
import pty
import signal
import sys
import time

from tui_helpers import settle

from batchtui.core import session as session_file
from batchtui.core.settings import Settings
from batchtui.tui.launcher import build_app


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "s.json"
    session_file.save(path, "one\n\ntwo", Settings(dtype="float32", batch_size=3))
    loaded = session_file.load(path)
    assert loaded.notice is None
    assert loaded.session.texts == ["one", "", "two"]
    assert loaded.session.settings == Settings(dtype="float32", batch_size=3)
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp file left behind


def test_corrupt_session_is_set_aside_with_a_notice(tmp_path):
    path = tmp_path / "s.json"
    path.write_text("{not json")
    loaded = session_file.load(path)
    assert loaded.session is None and "set aside" in loaded.notice
    assert not path.exists() and len(list(tmp_path.glob("s.json.corrupt-*"))) == 1
    path.write_text(json.dumps({"text": "x", "settings": {"batch_size": -4}}))
    assert session_file.load(path).session is None  # settings that do not validate are damage too


async def test_app_restores_texts_and_settings_and_saves_each_edit(tmp_path):
    path = tmp_path / "session.json"
    session_file.save(path, "kept text\nsecond", Settings(dtype="float32", padding_side="right"))
    app = build_app(["--session", str(path)])
    assert app.initial_texts == ["kept text", "second"]
    assert (app.settings.dtype, app.settings.padding_side) == ("float32", "right")
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await pilot.press("e")
        app.focused.move_cursor(app.focused.document.end)
        await pilot.press(*"!!")
        assert json.loads(path.read_text())["text"] == "kept text\nsecond!!"  # saved before any re-run
        await pilot.press("escape", "p")
        assert json.loads(path.read_text())["settings"]["padding_side"] == "left"
    explicit = build_app(["--session", str(path), "--dtype", "bfloat16"])
    assert explicit.settings.dtype == "bfloat16" and explicit.settings.padding_side == "left"
    given = build_app(["--session", str(path), "other"])
    assert given.initial_texts == ["other"]


async def test_corrupt_session_notice_in_the_app(tmp_path):
    path = tmp_path / "session.json"
    path.write_text("\x00garbage")
    app = build_app(["--session", str(path)])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        assert any("set aside" in n.message for n in app._notifications)
        assert app.comparison is not None and app.is_running


def test_sigkill_loses_nothing_typed(tmp_path):
    """Start the real app in a terminal, type, kill it with SIGKILL, start again: the texts are back."""
    path = tmp_path / "session.json"
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the app itself, in a pseudo-terminal
        os.execvpe(sys.executable, [sys.executable, "-m", "batchtui.tui", "--session", str(path), "first"], env)
    try:
        _wait_for(lambda: path.exists(), fd, "the first save")
        _pause(fd, 2.0)  # the terminal driver settles before keys are read
        os.write(fd, b"e")  # the editor, cursor at the start of the first line
        _pause(fd, 0.5)
        for char in b"typed before the kill ":
            os.write(fd, bytes([char]))
            _pause(fd, 0.01)
        _wait_for(lambda: "typed before the kill first" in path.read_text(), fd, "the typed text")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    app = build_app(["--session", str(path)])
    assert app.initial_texts == ["typed before the kill first"]


def _wait_for(condition, fd, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _drain(fd)
        try:
            if condition():
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _pause(fd, seconds: float) -> None:
    """Wait while reading the app's output: a full terminal buffer would block the app."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _drain(fd)
        time.sleep(0.005)


def _drain(fd) -> None:
    import select

    while select.select([fd], [], [], 0)[0]:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def test_sigterm_exits_cleanly_with_the_session_saved(tmp_path):
    path = tmp_path / "session.json"
    pid, fd = pty.fork()
    if pid == 0:
        env = {**os.environ, "TERM": "xterm-256color"}
        os.execvpe(sys.executable, [sys.executable, "-m", "batchtui.tui", "--session", str(path), "kept"], env)
    try:
        _wait_for(lambda: path.exists(), fd, "the first save")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            _drain(fd)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
    finally:
        os.close(fd)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(path.read_text())["text"] == "kept"
