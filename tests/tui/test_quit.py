"""Quit is instant: q, ctrl+c and SIGTERM end the app mid-run, the session saved first."""

import json
import os
import signal

import pytest
from helpers.terminal import pause, start_app, wait_exit, wait_for

# The app, with a forward pass that never ends (it leaves a marker file when it starts): whatever holds
# the exit for a pass would hold it forever.
STUCK_PASS = """
import pathlib, sys, time
import batchtui.core.models.loading as models
from batchtui.tui.launcher import main

load = models._load
marker = pathlib.Path(sys.argv.pop(1))


def stuck(*_):
    marker.touch()
    time.sleep(3600)


def load_with_a_stuck_pass(settings, device):
    loaded = load(settings, device)
    loaded.model.get_input_embeddings().register_forward_hook(stuck)
    return loaded


models._load = load_with_a_stuck_pass
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["q", "ctrl+c", "SIGTERM"])
def test_quit_mid_pass_exits_at_once_with_the_session_saved(how, tmp_path):
    path = tmp_path / "session.json"
    marker = tmp_path / "pass-started"
    pid, fd = start_app([str(marker), "--session", str(path), "stuck"], python_args=("-c", STUCK_PASS))
    status = None
    try:
        wait_for(lambda: marker.exists(), fd, "the pass to start")
        os.write(fd, b"e")
        pause(fd, 0.3)
        os.write(fd, b"typed ")  # saved on each keystroke, before the quit
        pause(fd, 0.5)
        if how == "SIGTERM":
            os.kill(pid, signal.SIGTERM)
        else:
            os.write(fd, b"\x1b" if how == "q" else b"\x03")  # q types a q in the editor: leave it first
            pause(fd, 0.3)
            if how == "q":
                os.write(fd, b"q")
        status, _ = wait_exit(pid, fd, 60)  # a held exit never comes: the pass sleeps for an hour
    finally:
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert status is not None, f"{how} did not end the app while a pass ran"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(path.read_text())["text"] == "typed stuck"


def test_the_app_without_a_terminal_exits_with_a_message(tmp_path):
    """stdin not a terminal (a pipe, /dev/null, a cron job): one line and exit 2, not a busy wait."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "batchtui.tui", "--session", str(tmp_path / "s.json"), "--model", "tiny"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "batchtui: error: the app needs a terminal (stdin and stdout); for scripts and CI use `batchtui check` "
        "(see batchtui --help)"
    )
