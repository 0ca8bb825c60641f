"""Nothing lost: the session file is written on every edit, restored on start, set aside when corrupt."""

import json
import os
import signal

import pytest
from helpers.terminal import pause, start_app, wait_exit, wait_for
from helpers.tui_helpers import settle
from helpers.tui_helpers import wait_for as wait_in_app

from batchtui.core.reports import session as session_file
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

    def saved() -> dict:
        return json.loads(path.read_text())

    app = build_app(["--session", str(path)])
    assert app.initial_texts == ["kept text", "second"]
    assert app.startup_notice == f"restored 2 texts and the settings of the last session ({path}); texts on the " \
        "command line start afresh"  # fmt: skip
    assert (app.state.settings.dtype, app.state.settings.padding_side) == ("float32", "right")
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await pilot.press("e")
        app.focused.move_cursor(app.focused.document.end)
        run = app.state.run_number
        await pilot.press(*"!!")
        # The keys' edit reaches the app a message or two after the pilot returns on a busy machine: wait for it.
        await wait_in_app(pilot, lambda: saved()["text"] == "kept text\nsecond!!", "the edit saved")
        assert app.state.run_number == run  # saved at the edit, before the re-run it schedules
        await pilot.press("escape", "p")
        await wait_in_app(pilot, lambda: saved()["settings"]["padding_side"] == "left", "the setting saved")
    explicit = build_app(["--session", str(path), "--dtype", "bfloat16"])
    assert explicit.state.settings.dtype == "bfloat16" and explicit.state.settings.padding_side == "left"
    given = build_app(["--session", str(path), "other"])
    assert given.initial_texts == ["other"] and given.startup_notice is None


async def test_corrupt_session_notice_in_the_app(tmp_path):
    path = tmp_path / "session.json"
    path.write_text('{"version": 1, \x00garbage')
    app = build_app(["--session", str(path)])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        assert any("set aside" in n.message for n in app._notifications)
        assert app.state.comparison is not None and app.is_running


@pytest.mark.slow
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


def test_a_session_nested_past_the_parser_s_depth_is_set_aside_and_the_app_starts(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"version": 1, "text": "x", "settings": ' + "[" * 100_000 + "]" * 100_000 + "}")
    app = build_app(["--session", str(path)])
    assert not isinstance(app, int) and "set aside" in app.startup_notice
    assert not path.exists() and len(list(tmp_path.glob("s.json.corrupt-*"))) == 1


def test_an_unusable_nested_value_is_named_by_its_type_not_dumped(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": 1, "text": "x", "settings": {"dtype": [[["deep"] * 50] * 50]}}))
    loaded = session_file.load(path)
    assert loaded.session.texts == ["x"] and loaded.notice.endswith("dtype=<list>")


def _folder_with_remote_code(folder, tiny_path):
    """A checkpoint whose config names a modeling file of its own: running it leaves a marker file."""
    import shutil

    shutil.copytree(tiny_path, folder)
    marker = folder / "RAN"
    (folder / "hostile.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "hostile.Model", "AutoConfig": "hostile.Config"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def test_remote_code_runs_only_for_a_model_named_on_the_command_line(tmp_path, tiny_path):
    """A session may bring a model back, but --trust-remote-code applies to the --model of the same command
    line: a session naming a folder with code of its own loads it without running that code."""
    hostile, marker = _folder_with_remote_code(tmp_path / "hostile", tiny_path)
    path = tmp_path / "s.json"
    session_file.save(path, "hello", Settings(model=str(hostile)))
    app = build_app(["--session", str(path), "--trust-remote-code"])
    assert app.state.settings.model == str(hostile) and app.state.settings.trust_remote_code is False
    assert "--trust-remote-code is for a model named with --model" in app.startup_notice
    named = build_app(["--session", str(path), "--trust-remote-code", "--model", "tiny"])
    assert named.state.settings.model == "tiny" and named.state.settings.trust_remote_code is True
    assert named.trusted_model == "tiny"
    from batchtui.core.models.loading import load_model

    load_model(app.state.settings)  # the tiny weights load as a Qwen2; the folder's own code is never run
    assert not marker.exists()


async def test_switching_model_in_the_app_never_carries_the_trust_over(tmp_path, tiny_path):
    from helpers.tui_helpers import make_app

    app = make_app(model="tiny", trust_remote_code=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("M")
        await pilot.pause()
        prompt = app.screen.query_one("Input")
        prompt.value = "qwen2-english-4m"
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.state.settings.model == "qwen2-english-4m" and app.state.settings.trust_remote_code is False


def test_a_400_digit_number_in_a_session_is_set_aside_and_the_app_starts(tmp_path):
    """A number no float holds (an integer of 400 digits as `atol`) is dropped like any unusable setting: the
    defaults stand in, a notice says so, and nothing raises."""
    import json as json_module

    from batchtui.core.reports import session as session_file

    path = tmp_path / "session.json"
    path.write_text('{"version": 1, "text": "a", "settings": {"atol": ' + "9" * 400 + ', "batch_size": 4}}')
    loaded = session_file.load(path)
    assert loaded.session.settings.atol == 1e-05 and loaded.session.settings.batch_size == 4
    assert "atol=9999" in loaded.notice and loaded.notice.endswith("…")  # (cut)
    assert json_module.loads(path.read_text())["settings"]["batch_size"] == 4  # the file as it was
