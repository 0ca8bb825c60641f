"""Control characters in texts never reach the terminal, from any pane; the texts themselves are kept exactly."""

import json
import os
import unicodedata

import pytest
from helpers.terminal import OUTPUT, pause, start_app, wait_exit, wait_for
from helpers.tui_helpers import make_app, settle
from hypothesis import given
from hypothesis import strategies as st

from batchtui.core.cli.check import run_check
from batchtui.core.visible import from_editable, literal, to_editable

HOSTILE = [
    "retitle\x1b]0;PWNED\x07 the terminal",
    "bell\x07 and \x1b[31mred\x1b[0m",
    "c1 \x9b31m and \x90dcs\x9c",
    "form\x0cfeed and line\u2028separator",
    "rtl \u202eevil\u202c end and a \\x1b that is typed",
]


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cs") or ch in "\u2028\u2029\u202a\u202b\u202c\u202d\u202e"


def _screen_characters(app) -> str:
    """Every character the app's current screen sends to the terminal."""
    return "".join(segment.text for strip in app.screen._compositor.render_strips() for segment in strip)


@given(st.text(alphabet=st.characters(blacklist_characters="\n")))
def test_editable_form_is_safe_and_gives_the_text_back_exactly(text):
    shown = to_editable(text)
    assert not any(_unsafe(ch) for ch in shown if ch != "\t")
    assert from_editable(shown) == text


def test_editable_form_reads_as_typed():
    assert to_editable("a\x1bb") == "a\\x1bb"
    assert to_editable("C:\\Users\\x") == "C:\\Users\\x"  # ordinary backslashes stay single
    assert to_editable("\\x1b typed") == "\\\\x1b typed"  # a typed escape is not mistaken for ESC
    assert from_editable("\\x1b\\u2028\\x41") == "\x1b\u2028\\x41"  # only unsafe characters come from escapes
    assert literal("\x1b]0;x\x07\x9b") == "\\x1b]0;x\\x07\\x9b"


async def test_no_pane_shows_a_control_character_and_texts_are_kept(tmp_path):
    app = make_app(texts=HOSTILE)
    app.session_path = tmp_path / "session.json"
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert [t.text for t in app.state.comparison.texts] == HOSTILE  # run byte for byte
        for keys in ([], ["j", "l", "l"], ["n", "n"], ["e"], ["escape", "L"], ["m"]):
            await pilot.press(*keys)
            await settle(pilot, app)
            shown = _screen_characters(app)
            assert not [ch for ch in shown if _unsafe(ch)], keys
        assert "\\x1b]0;PWNED\\x07" in shown  # visible, escaped
        app.notify(f"quoting {HOSTILE[0]}")
        await pilot.pause()
        assert not [ch for ch in _screen_characters(app) if _unsafe(ch)]
    assert json.loads(app.session_path.read_text())["text"] == "\n".join(HOSTILE)


async def test_small_screen_is_safe_too():
    app = make_app(texts=HOSTILE)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("j", "j", "l")
        await settle(pilot, app)
        assert not [ch for ch in _screen_characters(app) if _unsafe(ch)]


def test_check_table_and_json_keep_controls_off_the_terminal(capsys):
    run_check(["--batch-size", "1", "--json", "-", *HOSTILE])
    captured = capsys.readouterr()
    assert not [ch for ch in captured.out + captured.err if _unsafe(ch) and ch != "\n"]
    assert [t["text"] for t in json.loads(captured.out)["texts"]] == HOSTILE


@pytest.mark.slow
def test_real_terminal_never_receives_the_escape_sequences(tmp_path):
    """The real app in a pseudo-terminal: its bytes never hold the texts' OSC, CSI or C1 sequences."""
    path = tmp_path / "session.json"
    pid, fd = start_app(["--session", str(path), *HOSTILE])
    try:
        wait_for(lambda: path.exists(), fd, "the first save")
        pause(fd, 3.0)
        os.write(fd, b"e")  # the editor pane, where an OSC once retitled the terminal
        pause(fd, 1.0)
        os.write(fd, b"\x1b")
        pause(fd, 0.5)
        status = None
        for _ in range(5):  # a busy app may read the escape and the q as one key (alt+q): q again
            os.write(fd, b"q")
            status, _ = wait_exit(pid, fd, 15)  # a loaded machine (a full run's workers) exits slowly
            if status is not None:
                break
        output = bytes(OUTPUT.pop(fd, b""))
    finally:
        os.close(fd)
    assert status is not None
    assert b"PWNED" in output  # the text was shown...
    for sequence in (b"\x1b]0;PWNED", b"\x1b[31mred", "\x9b".encode(), "\x90".encode(), "\u202e".encode()):
        assert sequence not in output  # ...but never its control sequences
    assert json.loads(path.read_text())["text"] == "\n".join(HOSTILE)


def test_error_lines_never_carry_an_escape_sequence(tmp_path, tiny_path, capfd):
    """Strings that did not come from batchtui (a folder's name, an option's value, transformers' own
    message, a checkpoint of the wrong shape) reach the terminal with their control characters escaped,
    in one line, and transformers' loading chatter does not reach it at all (captured at the file
    descriptors, with every warning shown as a fresh process would show its first)."""
    import shutil
    import warnings

    evil = tmp_path / "evil\x1b[31mred"
    evil.mkdir()
    wrong_shape = tmp_path / "wrong\x1b]0;title\x07shape"
    shutil.copytree(tiny_path, wrong_shape)
    config = json.loads((wrong_shape / "config.json").read_text())
    config["hidden_size"] = 256  # the weights are 128 wide
    (wrong_shape / "config.json").write_text(json.dumps(config))
    for args in (["--model", str(evil)], ["--model", "tiny", "--attn", "\x1b[2Jwiped"], ["--model", str(wrong_shape)]):
        capfd.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            code = run_check(["a", *args])
        out, err = capfd.readouterr()
        assert code == 2, err
        assert "\x1b" not in err and "\x07" not in err and "\x1b" not in out
        assert err.count("\n") == 1, err  # one line
