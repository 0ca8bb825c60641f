"""Where keys go: typing in the editor is text, Escape comes back to the heatmap from anywhere, Tab visits
the panes (not every field), and the navigation keys move the selection from every pane but the editor."""

from __future__ import annotations

from helpers.tui_helpers import make_app, settle, wait_for

from batchtui.tui.widgets.detail import DetailPane
from batchtui.tui.widgets.heatmap import Heatmap
from batchtui.tui.widgets.settings_panel import SettingsPanel
from batchtui.tui.widgets.summary_table import SummaryTable
from batchtui.tui.widgets.texts_editor import TextsEditor

LONG = ["a", "The quick brown fox jumps over the lazy dog.", "Hello, world!"]


async def test_typing_in_the_editor_never_runs_a_command_and_escape_leaves_it():
    app = make_app(texts=LONG)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        editor = app.query_one(TextsEditor)
        await pilot.press("e")
        assert app.focused is editor
        await pilot.press("end", "tab", "d", "q", "M", "shift+tab", "p")
        # Tab typed a tab and the letters went into the text: no dtype change, no quit, no model prompt.
        assert editor.text.split("\n")[0] == "a\tdqMp"
        assert app.state.settings.dtype == "bfloat16" and app.state.settings.padding_side == "left"
        assert app.focused is editor and len(app.screen_stack) == 1
        await pilot.press("escape")
        assert isinstance(app.focused, Heatmap)


async def test_an_edit_s_rerun_that_comes_as_the_app_closes_does_nothing():
    """A text typed just before the app closes starts the edit's timer; when it fires, the screen's widgets may be
    gone already: the rerun does nothing (no traceback at exit)."""
    app = make_app(texts=LONG)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("e", "end", "x")
        runs = app.state.run_number
        await app.explorer.editor.remove()
        await pilot.pause(0.8)  # past the edit's debounce
        assert app.state.run_number == runs and app.is_running


async def test_tab_cycles_the_panes_and_escape_returns_from_each():
    app = make_app(texts=LONG)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        seen = []
        for _ in range(4):
            await pilot.press("tab")
            kinds = set(map(type, app.focused.ancestors_with_self))
            seen.append(next(p for p in (Heatmap, DetailPane, SummaryTable, SettingsPanel) if p in kinds))
        assert seen == [DetailPane, SummaryTable, SettingsPanel, Heatmap]
        await pilot.press("shift+tab")
        assert SettingsPanel in map(type, app.focused.ancestors_with_self)
        for pane_keys in (("tab",), ("tab", "tab"), ("tab", "tab", "tab"), ("e",)):
            await pilot.press("escape")
            await pilot.press(*pane_keys)
            assert not isinstance(app.focused, Heatmap)
            await pilot.press("escape")
            assert isinstance(app.focused, Heatmap)


async def test_tab_keeps_the_footer_s_keys_and_a_key_that_comes_is_shown():
    """A focus change publishes the screen's bindings twice: the footer rebuilds its keys only when the keys it
    shows change (each rebuild restyled every key, most of what a Tab press cost)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        keys = list(app.screen.query("FooterKey"))
        assert "Re-run" in [key.description for key in keys]
        for _ in range(3):
            await pilot.press("tab")
        await pilot.pause()
        assert list(app.screen.query("FooterKey")) == keys  # the same widgets, not rebuilt ones
        app.bind("x", "bell", description="Ring")
        app.refresh_bindings()
        await wait_for(pilot, lambda: "Ring" in [key.description for key in app.screen.query("FooterKey")], "the key")


async def test_navigation_keys_move_the_selection_from_the_summary_and_the_settings():
    app = make_app(texts=LONG)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("j")  # the long text
        assert app.state.selected == (1, 0)
        await pilot.press("tab", "tab")  # the detail (whose ↑/↓ and page keys scroll it), then the summary
        await pilot.press("right", "right", "end")
        last = len(app.state.comparison.texts[1].positions) - 1
        assert app.state.selected == (1, last)
        await pilot.press("home")
        assert app.state.selected == (1, 0)
        await pilot.press("tab")  # the settings: up / down move between fields, the rest navigates
        panel = app.query_one(SettingsPanel)
        first = app.focused
        await pilot.press("down")
        assert app.focused is not first and app.focused.parent is panel
        await pilot.press("up")
        assert app.focused is first
        await pilot.press("l", "l", "pagedown")
        assert app.state.selected == (1, last)
        await pilot.press("g")
        assert app.state.selected == (1, 0)
        # Escape from a settings field is the heatmap again, whose own keys still work.
        await pilot.press("escape", "down")
        assert isinstance(app.focused, Heatmap) and app.state.selected[0] == 2


async def test_the_focused_pane_is_marked_in_its_title():
    app = make_app(texts=LONG)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        heatmap, summary = app.query_one(Heatmap), app.query_one(SummaryTable)
        focused_title = heatmap.styles.border_title_background
        await pilot.press("tab")
        assert app.query_one(DetailPane).styles.border_title_background == focused_title
        await pilot.press("tab")
        assert summary.styles.border_title_background == focused_title
        assert heatmap.styles.border_title_background != focused_title
