"""Never destroy what is not ours: session paths, symlinks, two apps on one session, reports, read-only dirs."""

import json
import os
import stat
from pathlib import Path

import pytest
from helpers.commands import start
from helpers.tui_helpers import make_app, settle

from batchtui.core.cli.check import run_check
from batchtui.core.reports import session as session_file
from batchtui.core.safe_files import write_new, write_text
from batchtui.core.settings import Settings
from batchtui.tui.launcher import build_app, run_app


def _fingerprint(path):
    """What must not change about a path batchtui refused: its type, inode and content."""
    st = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), st.st_ino, content


@pytest.fixture
def refused_paths(tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a session\n")
    other_json = tmp_path / "config.json"
    other_json.write_text(json.dumps({"theme": "dark", "version": 3}))
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"\x00\xff\xfe binary")
    return {
        "a folder": folder,
        "a FIFO": fifo,
        "a device": Path("/dev/null"),
        "a text file": notes,
        "another program's JSON": other_json,
        "a binary file": binary,
    }


@pytest.mark.parametrize(
    "kind", ["a folder", "a FIFO", "a device", "a text file", "another program's JSON", "a binary file"]
)
def test_session_path_that_is_not_ours_exits_2_untouched(kind, refused_paths, capsys):
    path = refused_paths[kind]
    before = _fingerprint(path)
    for argv in (["--session", str(path)], ["--session", str(path), "a text given"]):
        assert build_app(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("batchtui: error: ")
        assert _fingerprint(path) == before
    assert not list(path.parent.glob("*.corrupt-*"))


def test_session_dot_is_refused_not_a_crash(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert build_app(["--session", "."]) == 2
    assert "is a directory" in capsys.readouterr().err


async def test_session_symlink_is_written_through(tmp_path):
    target = tmp_path / "real" / "session.json"
    target.parent.mkdir()
    session_file.save(target, "kept", Settings(model="tiny"))
    link = tmp_path / "link.json"
    link.symlink_to(target)
    app = build_app(["--session", str(link), "new text"])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["text"] == "new text"


def test_a_second_app_on_one_session_is_refused_at_start(tmp_path, capsys):
    path = tmp_path / "session.json"
    session_file.save(path, "the first app's edits", Settings(model="tiny"))
    first = session_file.SessionLock(path)
    assert first.acquire()
    try:
        assert run_app(["--session", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"in use by another batchtui (pid {os.getpid()})" in err and "--session" in err
        assert json.loads(path.read_text())["text"] == "the first app's edits"
    finally:
        first.release()
    again = session_file.SessionLock(path)
    assert again.acquire()  # released with its holder
    again.release()


def test_reports_never_share_a_name_and_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        names = [write_new(tmp_path, "report", ".json", f"{i}\n") for i in range(3)]
        rewritten = write_text(tmp_path / "plain.json", "x")
        os.umask(0o077)
        private = write_text(tmp_path / "private.json", "x")
    finally:
        os.umask(old)
    assert [p.name for p in names] == ["report.json", "report-2.json", "report-3.json"]
    assert [p.read_text() for p in names] == ["0\n", "1\n", "2\n"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in (*names, rewritten)} == {0o644}
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_rewriting_keeps_an_existing_files_mode_and_writes_a_device_in_place(tmp_path):
    shared = tmp_path / "shared.json"
    shared.write_text("old")
    shared.chmod(0o664)
    write_text(shared, "new")
    assert shared.read_text() == "new" and stat.S_IMODE(shared.stat().st_mode) == 0o664
    before = _fingerprint(Path("/dev/null"))
    write_text("/dev/null", "discarded")
    assert _fingerprint(Path("/dev/null")) == before


def test_json_report_to_a_device_is_written_in_place(capsys):
    before = os.stat("/dev/null")
    assert run_check(["--batch-size", "1", "--json", "/dev/null", "hi"]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


async def test_app_reports_in_one_second_get_two_names_in_the_output_dir(tmp_path):
    out = tmp_path / "reports"
    app = build_app(["--session", str(tmp_path / "s.json"), "--output-dir", str(out), "one", "two"])
    assert app.output_dir == out.resolve()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+s", "enter", "ctrl+s", "enter", "f8", "f8")  # the offered names: never the same
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        help_text = " ".join(str(w.render()) for w in app.screen.query("#help-output"))
        assert str(out.resolve()) in help_text
    reports = sorted(p.name for p in out.glob("batchtui-report-*.json"))
    shots = sorted(p.name for p in out.glob("batchtui-screenshot-*.svg"))
    assert len(reports) == 2 and len(shots) == 2
    assert all(json.loads((out / name).read_text())["summary"]["texts"] == 2 for name in reports)


def test_output_dir_that_cannot_hold_reports_exits_2(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert build_app(["--session", str(tmp_path / "s.json"), "--output-dir", str(a_file / "sub"), "t"]) == 2
    assert "cannot use output folder" in capsys.readouterr().err


async def test_unwritable_state_dir_gives_one_notice_and_the_app_works_on(tmp_path, monkeypatch):
    from batchtui.tui.app import BatchtuiApp

    said = []  # every notice, as given: one on screen may have timed out on a busy machine before it is looked at
    notify = BatchtuiApp.notify
    monkeypatch.setattr(
        BatchtuiApp, "notify", lambda app, message, **kw: said.append(message) or notify(app, message, **kw)
    )
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")  # mkdir fails, even for root
    app = make_app(texts=["one", "two"])
    app.session_path = blocker / "batchtui" / "session.json"
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await pilot.press("e", *"abc", "escape", "p")
        await settle(pilot, app)
        assert len([message for message in said if "cannot save the session" in message]) == 1
        assert [t.text for t in app.state.comparison.texts] == ["abcone", "two"] and app.is_running


def _check_command(*args):
    import sys

    return [sys.executable, "-m", "batchtui.core", "check", "--model", "tiny", "--quiet", "a", "bc", *args]


@pytest.mark.slow
def test_json_to_dev_stdout_works_through_a_pipe():
    """`--json /dev/stdout` is `--json -`: piped it is the report alone, parseable, and the table goes to
    stderr."""
    import subprocess

    # What it waits for is the CPU: a fresh process imports torch and transformers (~3 s alone; minutes on a new
    # machine's cold disk cache with the rest of the suite running beside it).
    piped = subprocess.run(_check_command("--json", "/dev/stdout"), capture_output=True, text=True, timeout=600)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["summary"]["texts"] == 2 and "allclose" in piped.stderr


def test_json_to_dev_stdout_with_stdout_a_file_writes_into_that_file(capfd):
    """The same in this process, whose stdout pytest has made a file at the descriptor."""
    code = run_check(["--model", "tiny", "a", "bc", "--json", "/dev/stdout"])
    out, err = capfd.readouterr()
    assert code == 0 and json.loads(out)["summary"]["texts"] == 2 and "allclose" in err


def test_a_full_disk_prints_the_results_then_one_line_and_exits_2(capfd):
    code = run_check(["--model", "tiny", "a", "bc", "--json", "/dev/full"])
    out, err = capfd.readouterr()
    assert code == 2
    assert "allclose" in out  # the table came first: nothing measured is lost
    assert err.strip() == "batchtui: error: cannot write the report to /dev/full: No space left on device"


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """Interrupted while its report waits for a reader (a FIFO nobody opens): one line, exit 130."""
    import signal
    import subprocess
    import time

    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    process = start(_check_command("--json", str(fifo)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while "allclose" not in process.stdout.readline():  # the table is printed before the report
            assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.3)  # now blocked opening the FIFO
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130
    assert stderr.strip() == "batchtui: interrupted"


def test_an_interrupted_report_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "report.json"

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text(target, '{"half": ')
    assert list(tmp_path.iterdir()) == []


def test_a_hard_link_cannot_defeat_the_session_lock(tmp_path, capsys):
    path = tmp_path / "session.json"
    session_file.save(path, "the first app's edits", Settings(model="tiny"))
    first = session_file.SessionLock(path)
    assert first.acquire()
    try:
        alias = tmp_path / "alias.json"
        os.link(path, alias)
        assert run_app(["--session", str(alias)]) == 2
        assert "has 2 names (hard links)" in capsys.readouterr().err
        assert json.loads(path.read_text())["text"] == "the first app's edits"
    finally:
        first.release()


def test_a_state_home_that_is_a_file_starts_the_app_as_the_docs_say(tmp_path, monkeypatch):
    """XDG_STATE_HOME naming a file: no session to restore, the lock not taken, the app built (it then says once
    that it cannot save, as for a read-only folder above)."""
    state = tmp_path / "state"
    state.write_text("a file")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    app = build_app(["t"])
    assert not isinstance(app, int) and app.session_path == state / "batchtui" / "session.json"
    assert session_file.SessionLock(app.session_path).acquire() is False
    assert state.read_text() == "a file"


def test_without_a_terminal_a_damaged_session_is_left_as_it_is(tmp_path, capsys, monkeypatch):
    import io

    path = tmp_path / "s.json"
    path.write_text('{"version": 1, "text": "x", broken')
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a tty
    assert run_app(["--session", str(path)]) == 2
    assert "the app needs a terminal" in capsys.readouterr().err
    assert path.read_text() == '{"version": 1, "text": "x", broken' and not list(tmp_path.glob("s.json.corrupt-*"))
