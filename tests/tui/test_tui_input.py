"""The app's checks of its input: a bad text, setting or session value is refused with a notification,
the texts are kept, and the command line wins over the session."""

import json

import pytest
import torch
from helpers.tui_helpers import make_app, settle, wait_for
from textual import events

from batchtui.core import Settings
from batchtui.core.models.loading import load_model
from batchtui.core.reports import session as session_file
from batchtui.tui.launcher import build_app

TEXTS = ["first text", "a second, longer text"]


TUI_CASES = [
    ({"model": "not-causal"}, "has a config.json but no weights"),
    ({"model": "no-pad-no-eos"}, "has neither a pad nor an eos token"),
    ({"top_k": 600}, "top-k must be at most the vocabulary size 512"),
    ({"model": "nobody/nothing"}, "hub id 'nobody/nothing' is not in the local cache"),
]


LONE_SURROGATE = "caf\udce9"  # what Python makes of the Latin-1 bytes b"caf\xe9" in argv


@pytest.mark.parametrize(("settings", "message"), TUI_CASES)
async def test_app_bad_input_notifies_and_keeps_the_texts(settings, message, broken):
    settings = {k: broken.get(v, v) for k, v in settings.items()}
    app = make_app(texts=TEXTS, **settings)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        assert any(message in n.message for n in app._notifications)
        assert app.is_running
        assert app.query_one("#editor").text == "\n".join(TEXTS)


async def test_app_bad_tolerance_typed_is_refused_and_blank_lines_are_counted():
    app = make_app(texts=["one", "", "   ", "two"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert [t.text for t in app.state.comparison.texts] == ["one", "two"]
        assert "2 blank lines skipped" in app.query_one("#status").full_text()
        field = app.query_one("#atol")
        field.value = "-1"
        await field.action_submit()
        await pilot.pause()
        assert any("atol must be a finite number >= 0" in n.message for n in app._notifications)
        field.value = "abc"
        await field.action_submit()
        await pilot.pause()
        assert any("atol must be a number, not 'abc'" in n.message for n in app._notifications)
        assert app.state.settings.atol == 1e-5 and app.is_running


async def test_app_survives_out_of_memory():
    app = make_app(texts=TEXTS)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        model = load_model(app.state.settings).model
        handle = model.model.layers[0].register_forward_pre_hook(
            lambda m, a: (_ for _ in ()).throw(torch.OutOfMemoryError("out of memory"))
        )
        try:
            await pilot.press("r")
            await settle(pilot, app)
        finally:
            handle.remove()
        assert any("lower the batch size" in n.message for n in app._notifications)
        await pilot.press("r")
        await settle(pilot, app)
        assert app.state.comparison is not None and app.is_running


def test_the_command_line_wins_even_at_the_default(tmp_path):
    path = tmp_path / "session.json"
    saved = Settings(model="tiny", batch_size=4, dtype="float32", padding_side="right", atol=0.5, decompose=True)
    session_file.save(path, "kept", saved)
    restored = build_app(["--session", str(path)])
    assert (
        restored.state.settings.batch_size,
        restored.state.settings.padding_side,
        restored.state.settings.decompose,
    ) == (
        4,
        "right",
        True,
    )
    app = build_app(
        ["--session", str(path), "--batch-size", "8", "--dtype", "auto", "--padding-side", "left", "--atol", "1e-5"]
    )
    assert app.initial_texts == ["kept"]
    assert (app.state.settings.batch_size, app.state.settings.dtype, app.state.settings.padding_side) == (
        8,
        "auto",
        "left",
    )
    assert app.state.settings.atol == 1e-5 and app.state.settings.decompose is True  # not given: the session's


def test_a_non_utf8_text_never_reaches_the_app_or_its_session(tmp_path, capsys):
    path = tmp_path / "session.json"
    assert build_app(["--session", str(path), LONE_SURROGATE]) == 2
    assert "text 1 is not valid UTF-8" in capsys.readouterr().err
    assert not path.exists()


async def test_a_lone_surrogate_pasted_in_the_app_is_saved_and_refused_by_the_run(tmp_path):
    path = tmp_path / "session.json"
    app = make_app(texts=["fine"])
    app.session_path = path
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await pilot.press("e", "end")
        app.post_message(events.Paste(f"\n{LONE_SURROGATE}"))  # a paste of broken bytes, as the terminal sends it
        # The run after the edit's debounce refuses the text, however late a loaded machine starts it.
        refused = "text 2 is not valid UTF-8"
        await wait_for(pilot, lambda: any(refused in n.message for n in app._notifications), f"'{refused}'")
        assert app.query_one("#editor").text == "fine\ncaf\\udce9"  # shown escaped: no terminal prints it
        assert app.is_running
    assert json.loads(path.read_text())["text"] == f"fine\n{LONE_SURROGATE}"
    restarted = build_app(["--session", str(path)])
    assert restarted.initial_texts == ["fine", LONE_SURROGATE]  # starts, the text kept for the user to fix


async def test_nan_typed_into_a_tolerance_is_refused_and_the_field_restored():
    app = make_app(texts=["one"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        generation = app.state.run_number
        for typed in ("nan", "inf", "-inf"):
            field = app.query_one("#rtol")
            field.value = typed
            await field.action_submit()
            await pilot.pause()
            assert field.value == "0.001"
        assert app.state.settings.rtol == 1e-3 and app.state.run_number == generation
        assert any("rtol must be a finite number >= 0, not nan" in n.message for n in app._notifications)


async def test_app_numbers_texts_by_their_editor_line():
    app = make_app(texts=["one", "", "  ", "two"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert [(t.line, t.text) for t in app.state.comparison.texts] == [(1, "one"), (4, "two")]
        table = app.query_one("#summary")
        assert [str(table.get_row_at(row)[0]) for row in range(table.row_count)] == ["1", "4"]
        await pilot.press("j")
        assert str(app.query_one("#detail").border_title) == "text 4 · position 0"
        assert str(app.query_one("#heatmap").border_subtitle) == "text 4 · pos 0"
        assert str(app.query_one("#layers").border_title).endswith(" text 4")


async def test_the_editor_reaches_either_end_of_the_texts_and_leaves_them_unscrolled():
    from batchtui.tui.widgets.texts_editor import TextsEditor

    long = "a long text " * 30
    for size in ((120, 40), (80, 24)):
        app = make_app(texts=["first", long, "last one"])
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app)
            await pilot.press("e", "ctrl+end")
            editor = app.query_one(TextsEditor)
            assert editor.cursor_location == editor.document.end == (2, len("last one"))
            await pilot.press("ctrl+home")
            assert editor.cursor_location == (0, 0)
            await pilot.press("down", "end")  # the long line's end: scrolled far sideways
            await pilot.pause()
            assert editor.scroll_x > 0
            await pilot.press("escape")
            await pilot.pause()
            assert editor.scroll_x == 0 and not editor.has_focus
