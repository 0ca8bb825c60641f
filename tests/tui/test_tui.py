"""The app end to end (tui/app.py): first frame, runs on edits and settings, stale results, errors, reports,
help, the command palette."""

import json
import time

from helpers.tui_helpers import MIXED, detail_title, make_app, settle, wait_for
from textual.command import CommandList, CommandPalette
from textual.widgets import Input

from batchtui.tui.app import EDIT_DEBOUNCE_S
from batchtui.tui.engine_calls import post_result
from batchtui.tui.messages import ComparisonReady, GenerationFailed, ModelLoaded, RunFailed, RunProgress
from batchtui.tui.screens.help_screen import HelpScreen
from batchtui.tui.screens.prompt_screen import PromptScreen
from batchtui.tui.views.navigation import next_divergent
from batchtui.tui.widgets.heatmap import Heatmap
from batchtui.tui.widgets.summary_table import SummaryTable


def test_the_first_frame_waits_for_no_torch():
    """torch and transformers (over a second to import) load in the run's worker, after the first frame: the app's
    modules import without them."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['torch'] = sys.modules['transformers'] = None; "
        "import batchtui.tui.launcher, batchtui.tui.app"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


async def test_first_frame_comes_before_results_then_results_appear():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.state.comparison is None  # mounted and drawn; the model loads in a worker
        assert isinstance(app.focused, Heatmap)
        await settle(pilot, app)
        table = app.query_one(SummaryTable)
        assert table.row_count == len(MIXED)
        assert detail_title(app) == "text 1 · position 0"
        assert app.state.comparison.config["dtype"] == "bfloat16"


def _debounce_restarts(app) -> list[float]:
    """When the app restarts its edit debounce, as it runs: one time per edit that will re-run the texts."""
    restarts = []
    set_timer = app.set_timer

    def recorded(delay, callback, *args, **kwargs):
        if callback == app.action_rerun:
            restarts.append(time.monotonic())
        return set_timer(delay, callback, *args, **kwargs)

    app.set_timer = recorded
    return restarts


async def test_editing_a_text_reruns_and_changes_the_table():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        before = app.state.run_number
        await pilot.press("e")
        assert app.focused.id == "editor"
        app.focused.move_cursor(app.focused.document.end)
        restarts = _debounce_restarts(app)
        await pilot.press("enter", "enter", *"new text here")
        editor = app.query_one("#editor")
        await wait_for(pilot, lambda: app.state.run_text == editor.text, "a run of the edited texts")
        await settle(pilot, app)
        # One re-run for the whole burst of keys. A loaded machine may take longer than the debounce between two
        # keys' edits (the app's own times, not the test's): each such pause may start one run more, no other.
        long_pauses = sum(b - a >= EDIT_DEBOUNCE_S for a, b in zip(restarts, restarts[1:]))
        assert len(restarts) == len("new text here") + 2
        assert 1 <= app.state.run_number - before <= 1 + long_pauses, (long_pauses, restarts)
        assert app.query_one(SummaryTable).row_count == len(MIXED) + 1
        assert app.state.comparison.texts[-1].text == "new text here"
        assert "1 blank line skipped" in app.query_one("#status").full_text()
        await pilot.press("q")  # typed into the editor, not quitting
        assert app.is_running
        await pilot.press("escape")
        assert isinstance(app.focused, Heatmap)


async def test_setting_keys_rerun_with_new_settings():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("p")
        await settle(pilot, app)
        assert app.state.comparison.config["padding_side"] == "right"
        await pilot.press("b")
        await settle(pilot, app)
        assert app.state.comparison.config["batch_size"] == 16
        await pilot.press("d")
        await settle(pilot, app)
        assert app.state.comparison.config["dtype"] == "float16"
        assert app.query_one("#dtype").value == "float16"


async def test_stale_result_is_never_shown():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        shown = app.state.comparison
        stale = ComparisonReady(app.state.run_number - 1, shown)
        app.state.run_number += 1  # a newer run has started
        app.post_message(stale)
        await pilot.pause()
        assert app.state.settled_run == app.state.run_number - 1


async def test_a_run_that_ends_after_the_app_closed_is_dropped_without_an_error():
    # A worker's thread outlives the app when the user quits mid-run: its messages and results then arrive
    # with the widgets gone, and must be dropped, not raise into the closing app.
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        run, shown = app.state.run_number, app.state.comparison
    assert not app.is_running
    app.on_run_progress(RunProgress(run, "late"))
    app.on_run_failed(RunFailed(run, "late"))
    app.on_comparison_ready(ComparisonReady(run, shown))
    app.on_generation_failed(GenerationFailed(run, "late"))
    made = []
    post_result(app, lambda: "late", lambda result: made.append(result) or ModelLoaded(app.state.settings))
    post_result(app, lambda: 1 / 0, lambda result: ModelLoaded(app.state.settings))
    assert made == ["late"] and not app.post_message(ModelLoaded(app.state.settings))  # a closed app takes none
    assert app.state.settled_run == run and app.state.comparison is shown


async def test_engine_error_is_shown_and_the_app_survives():
    app = make_app(model="no-such-org/no-such-model")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        messages = [n.message for n in app._notifications]
        assert any("hub id 'no-such-org/no-such-model' is not in the local cache" in m for m in messages)
        assert app.is_running and app.state.comparison is None
        await pilot.press("e")
        app.focused.text = "   \n"
        await pilot.press("escape", "r")
        assert any("no texts to compare" in n.message for n in app._notifications)


async def test_ctrl_s_writes_the_report_and_f8_a_screenshot(tmp_path):
    app = make_app(tmp_path=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, PromptScreen)  # where: a fresh name in the output folder, offered
        await pilot.press("enter", "f8")
        await pilot.pause()
        reports = list(tmp_path.glob("batchtui-report-*.json"))
        assert len(reports) == 1
        assert any(f"written to {reports[0]}" in n.message for n in app._notifications)
    assert json.loads(reports[0].read_text())["summary"]["texts"] == len(MIXED)
    assert len(list(tmp_path.glob("*.svg"))) == 1


async def test_ctrl_s_saves_what_was_run_where_the_user_says_and_never_over_a_file(tmp_path):
    app = make_app(tmp_path=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")  # the generation view: its continuations belong in the report
        await wait_for(
            pilot,
            lambda: app.state.generated is not None and app.state.generated[0] == app.state.run_number,
            "generation",
        )
        chosen = tmp_path / "sub" / "mine.json"
        chosen.parent.mkdir()
        await pilot.press("ctrl+s")
        app.screen.query_one(Input).value = str(chosen)
        await pilot.press("enter")
        await pilot.pause()
        report = json.loads(chosen.read_text())
        assert report["summary"]["texts"] == len(MIXED)
        generation = report["generation"]
        assert [t["line"] for t in generation["texts"]] == [t.line for t in app.state.generated[1].texts]
        assert generation["summary"]["differ"] == app.state.generated[1].summary.differ
        assert any("comparison, generation written to" in n.message for n in app._notifications)
        # The same name again: refused, the file as it was.
        before = chosen.read_bytes()
        await pilot.press("ctrl+s")
        app.screen.query_one(Input).value = str(chosen)
        await pilot.press("enter")
        await pilot.pause()
        assert chosen.read_bytes() == before
        assert any("exists: a report never overwrites a file" in n.message for n in app._notifications)


async def test_help_screen_and_quit():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "q")
        await pilot.pause()
        assert not app.is_running


async def test_texts_are_shown_literally():
    texts = ["[red]x[/red]", "[link=http://x]y", "tab\there", "emoji 🙂 日本 שלום e\u0301"]
    app = make_app(texts=texts)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        table = app.query_one(SummaryTable)
        assert str(table.get_row_at(0)[1]) == "[red]x[/red]"
        shown = str(table.get_row_at(1)[1])  # cut to the column's width, literally
        assert shown == "[link=http://x]y" or ("[link=http://x]y".startswith(shown[:-1]) and shown.endswith("…"))
        assert str(table.get_row_at(2)[1]) == "tab\\there"


async def test_command_palette_runs_app_actions():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), "the command palette")
        await pilot.press(*"Next divergent")
        # The palette searches as it is typed into: wait for its first match, however loaded the machine.
        matches = app.screen.query_one(CommandList)
        await wait_for(
            pilot,
            lambda: matches.highlighted == 0 and "Next divergent" in str(matches.get_option_at_index(0).prompt),
            "the match",
        )
        await pilot.press("enter")
        expected = next_divergent(app.state.comparison, 0, 0)
        await wait_for(pilot, lambda: app.state.selected == expected, f"the selection to move to {expected}")
