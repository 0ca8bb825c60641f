"""Nothing lost: the session file is written on every edit, restored on start, set aside when corrupt."""

import json
import os
import signal

from terminal import pause, start_app, wait_exit, wait_for
from tui_helpers import settle

from batchtui.core import session as session_file
from batchtui.core.settings import Settings
from batchtui.tui.launcher import build_app


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "s.json"
    session_file.save(path, "one\n\ntwo", Settings(model="tiny", dtype="float32", batch_size=3))
    loaded = session_file.load(path)
    assert loaded.notice is None
    assert loaded.session.texts == ["one", "", "two"]
    assert loaded.session.settings == Settings(model="tiny", dtype="float32", batch_size=3)
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temp file left behind


def test_damaged_session_of_ours_is_set_aside_with_a_notice(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"version": 1, "saved_at": 17, "text": "cut off by a full disk')
    loaded = session_file.load(path)
    assert loaded.session is None and "set aside" in loaded.notice
    assert not path.exists() and len(list(tmp_path.glob("s.json.corrupt-*"))) == 1


def test_unusable_session_values_are_dropped_one_by_one(tmp_path):
    path = tmp_path / "s.json"
    settings = {"batch_size": 2.5, "atol": float("nan"), "rtol": 0.5, "dtype": "float32", "top_k": True}
    path.write_text(json.dumps({"version": 1, "text": "x\ny", "settings": settings}))  # NaN, as json writes it
    loaded = session_file.load(path)
    assert loaded.session.texts == ["x", "y"]
    assert loaded.session.settings == Settings(rtol=0.5, dtype="float32")  # the usable ones are kept
    for dropped in ("batch_size=2.5", "atol=nan", "top_k=True"):
        assert dropped in loaded.notice
    assert path.exists()  # nothing set aside: the file is ours and readable


async def test_app_restores_texts_and_settings_and_saves_each_edit(tmp_path):
    path = tmp_path / "session.json"
    session_file.save(path, "kept text\nsecond", Settings(model="tiny", dtype="float32", padding_side="right"))
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
    path.write_text('{"version": 1, \x00garbage')
    app = build_app(["--session", str(path)])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        assert any("set aside" in n.message for n in app._notifications)
        assert app.comparison is not None and app.is_running


def test_sigkill_loses_nothing_typed(tmp_path):
    """Start the real app in a terminal, type, kill it with SIGKILL, start again: the texts are back."""
    path = tmp_path / "session.json"
    pid, fd = start_app(["--session", str(path), "first"])
    try:
        wait_for(lambda: path.exists(), fd, "the first save")
        pause(fd, 2.0)  # the terminal driver settles before keys are read
        os.write(fd, b"e")  # the editor, cursor at the start of the first line
        pause(fd, 0.5)
        for char in b"typed before the kill ":
            os.write(fd, bytes([char]))
            pause(fd, 0.01)
        wait_for(lambda: "typed before the kill first" in path.read_text(), fd, "the typed text")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    app = build_app(["--session", str(path)])
    assert app.initial_texts == ["typed before the kill first"]


def test_sigterm_exits_cleanly_with_the_session_saved(tmp_path):
    path = tmp_path / "session.json"
    pid, fd = start_app(["--session", str(path), "kept"])
    try:
        wait_for(lambda: path.exists(), fd, "the first save")
        os.kill(pid, signal.SIGTERM)
        status, _ = wait_exit(pid, fd, 30)
    finally:
        os.close(fd)
    assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(path.read_text())["text"] == "kept"
