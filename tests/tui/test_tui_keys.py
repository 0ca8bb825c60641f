"""Every key of docs/app.md's table, pressed from each pane it works from (the heatmap, the summary, a settings
field; the editor types them), does what the table says: the keys belong to the explorer screen and the panes,
and none is lost or answered by the wrong pane when they move between them."""

from __future__ import annotations

import re

import pytest
from helpers.paths import REPOSITORY
from helpers.tui_helpers import make_app, settle, wait_for

from batchtui.tui.screens.help_screen import HelpScreen
from batchtui.tui.screens.prompt_screen import PromptScreen
from batchtui.tui.screens.remedies_screen import RemediesScreen
from batchtui.tui.screens.sweep_screen import SweepScreen
from batchtui.tui.views.navigation import next_divergent, next_flip, worst_flip
from batchtui.tui.widgets.heatmap import Heatmap
from batchtui.tui.widgets.settings_panel import SettingsPanel
from batchtui.tui.widgets.status_line import StatusLine
from batchtui.tui.widgets.summary_table import SummaryTable
from batchtui.tui.widgets.texts_editor import TextsEditor

DOCS = REPOSITORY / "docs" / "app.md"
# Flips on the built-in model in float64 are made by the test (see tui_helpers.batch_variant): none here, so the
# texts are long enough for every move and the jumps' answers are computed from the comparison on screen.
TEXTS = ["The quick brown fox jumps over the lazy dog.", "a", "Hello, world! How are you today?"]
PANES = ("heatmap", "summary", "settings")

# Each key of the table (as docs/app.md writes it) and the test below that presses it.
KEYS_TESTED = {
    "arrows": "moves",
    "h": "moves",
    "j": "moves",
    "k": "moves",
    "l": "moves",
    "Home": "moves",
    "End": "moves",
    "g": "moves",
    "G": "moves",
    "PgUp": "moves",
    "PgDn": "moves",
    "f": "jumps",
    "F": "jumps",
    "n": "jumps",
    "N": "jumps",
    "w": "jumps",
    "]": "jumps",
    "[": "jumps",
    "z": "views",
    "t": "views",
    "L": "views",
    "s": "views",
    "m": "views",
    "c": "views",
    "Tab / shift+Tab, Escape": "focus",
    "e": "focus",
    "ctrl+home": "focus",
    "ctrl+end": "focus",
    "r": "settings",
    "d": "settings",
    "p": "settings",
    "b": "settings",
    "o": "settings",
    "a": "settings",
    "i": "settings",
    "M": "screens",
    "ctrl+o": "screens",
    "R": "screens",
    "S": "screens",
    "I": "screens",
    "ctrl+s": "screens",
    "f8": "screens",
    "?": "screens",
    "F1": "screens",
    "q": "test_quit",
    "ctrl+c": "test_quit",
    "Escape": "focus",
}


def _documented_keys() -> set[str]:
    """The keys in the first column of docs/app.md's key table: each backticked one, or the cell as written."""
    keys = set()
    for row in re.findall(r"^\| (.+?) \| .+ \|$", DOCS.read_text(), flags=re.M)[1:]:  # the header: "key"
        ticked = re.findall(r"`([^`]+)`", row)
        keys.update(ticked or [row])
        if "arrows" in row:
            keys.add("arrows")
        if "F1" in row:
            keys.add("F1")
        if "Escape" in row and "`e`" in row:
            keys.add("Escape")
    return keys


def test_docs_key_table_is_the_keys_table_and_every_binding_is_in_it():
    """docs/app.md's table is rendered from tui/keys.py (the bindings' own table); every key the explorer binds is
    in one of its rows, and the local-only actions are the rows marked so."""
    from batchtui.tui.keys import KEY_ROWS, LOCAL_ONLY_ACTIONS, docs_table
    from batchtui.tui.screens.explorer_screen import ExplorerScreen

    assert docs_table() in DOCS.read_text()
    assert ExplorerScreen.BINDINGS == [b for row in KEY_ROWS for b in row.bindings]
    assert {"cycle_dtype", "remedies", "toggle_generation", "next_flip"} <= LOCAL_ONLY_ACTIONS
    assert not LOCAL_ONLY_ACTIONS & {"rerun", "help", "quit", "save_report", "focus_editor"}


def test_every_documented_key_has_a_test_here():
    assert _documented_keys() <= set(KEYS_TESTED), _documented_keys() - set(KEYS_TESTED)


async def _focus(pilot, app, pane: str) -> None:
    await pilot.press("escape")  # the heatmap; Tab on: the detail (where in view), the summary, the settings
    owner = {"heatmap": Heatmap, "summary": SummaryTable, "settings": SettingsPanel}[pane]
    for _ in range(3):
        if owner in map(type, app.focused.ancestors_with_self):
            break
        await pilot.press("tab")
    assert owner in map(type, app.focused.ancestors_with_self), (pane, app.focused)


async def _pressed_from(pilot, app, pane: str, key: str) -> None:
    await _focus(pilot, app, pane)
    await pilot.press(key)


def _last(app, text: int) -> int:
    return len(app.state.comparison.texts[text].positions) - 1


@pytest.mark.parametrize("pane", PANES)
async def test_the_moves_work_from_each_pane(pane):
    app = make_app(texts=TEXTS, dtype="float64")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        # Along a text: the same keys from every pane.
        for key, expected in (("l", 1), ("right", 2), ("h", 1), ("left", 0), ("G", _last(app, 0)), ("g", 0)):
            await _pressed_from(pilot, app, pane, key)
            assert app.state.selected == (0, expected), (pane, key)
        for key, expected in (("end", _last(app, 0)), ("home", 0)):
            await _pressed_from(pilot, app, pane, key)
            assert app.state.selected == (0, expected), (pane, key)
        await _pressed_from(pilot, app, pane, "pagedown")
        assert app.state.selected[1] > 1, pane
        await _pressed_from(pilot, app, pane, "pageup")
        assert app.state.selected == (0, 0), pane
        # Across texts: j and k everywhere; the arrows too, but in the settings, where they step between fields.
        await _pressed_from(pilot, app, pane, "j")
        assert app.state.selected == (1, 0), pane
        await _pressed_from(pilot, app, pane, "k")
        assert app.state.selected == (0, 0), pane
        await _pressed_from(pilot, app, pane, "down")
        if pane == "settings":
            assert app.state.selected == (0, 0) and app.focused.parent is app.query_one(SettingsPanel)
        else:
            assert app.state.selected == (1, 0), pane
            await _pressed_from(pilot, app, pane, "up")
            assert app.state.selected == (0, 0), pane


@pytest.mark.parametrize("pane", PANES)
async def test_the_jumps_work_from_each_pane(pane):
    app = make_app(texts=TEXTS, dtype="bfloat16")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        comparison = app.state.comparison
        await _pressed_from(pilot, app, pane, "right_square_bracket")
        assert app.state.selected[0] == 1, pane
        await _pressed_from(pilot, app, pane, "left_square_bracket")
        assert app.state.selected[0] == 0, pane
        for key, finder, forward in (("n", next_divergent, True), ("N", next_divergent, False),
                                     ("f", next_flip, True), ("F", next_flip, False)):  # fmt: skip
            before = app.state.selected
            expected = finder(comparison, *before, forward=forward)
            app.clear_notifications()
            await _pressed_from(pilot, app, pane, key)
            if expected is None:  # said, and the selection stays
                assert app.state.selected == before and len(app._notifications) == 1, (pane, key)
            else:
                assert app.state.selected == expected, (pane, key)
        expected = worst_flip(comparison)
        await _pressed_from(pilot, app, pane, "w")
        assert expected is None or app.state.selected == expected, pane


@pytest.mark.parametrize("pane", PANES)
async def test_the_view_keys_work_from_each_pane(pane):
    app = make_app(texts=[TEXTS[0] * 6, "a"], dtype="float32")
    async with app.run_test(size=(80, 24)) as pilot:  # short: L swaps, and the long text has an overview
        await settle(pilot, app)
        screen, heatmap = app.screen, app.query_one(Heatmap)
        await _pressed_from(pilot, app, pane, "z")
        assert heatmap.zoomed, pane
        await _pressed_from(pilot, app, pane, "L")
        assert screen.has_class("-layers"), pane
        await _pressed_from(pilot, app, pane, "t")
        assert screen.has_class("-topk"), pane
        await _pressed_from(pilot, app, pane, "s")
        assert app.state.summary_order != "text", pane
        await _pressed_from(pilot, app, pane, "m")
        assert app.state.module_view and app.state.settings.modules, pane
        await settle(pilot, app)
        await _pressed_from(pilot, app, pane, "c")
        assert app.state.generation_view and screen.has_class("-generation"), pane
        await wait_for(pilot, lambda: app.state.generation_on_screen is not None, "the generation")
        await pilot.press("escape")  # closes the generation view
        assert not app.state.generation_view and isinstance(app.focused, Heatmap)


@pytest.mark.parametrize("pane", PANES)
async def test_the_setting_keys_work_from_each_pane(pane):
    app = make_app(texts=TEXTS[:2], dtype="bfloat16")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        run = app.state.run_number
        await _pressed_from(pilot, app, pane, "r")
        assert app.state.run_number == run + 1, pane
        before = app.state.settings
        for key, field in (("d", "dtype"), ("p", "padding_side"), ("b", "batch_size"), ("o", "positions"),
                           ("a", "attn"), ("i", "invariant")):  # fmt: skip
            await _pressed_from(pilot, app, pane, key)
            assert getattr(app.state.settings, field) != getattr(before, field), (pane, key)
            # The panel shows what the key chose, and the run uses it.
            assert app.query_one(SettingsPanel).settings == app.state.settings
            await settle(pilot, app)
            assert app.state.comparison.config[field] == getattr(app.state.settings, field), (pane, key)


async def test_the_focus_keys_and_the_editor_s_own_keys():
    app = make_app(texts=TEXTS)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        for pane in PANES:
            await _pressed_from(pilot, app, pane, "e")
            editor = app.query_one(TextsEditor)
            assert app.focused is editor, pane
            await pilot.press("ctrl+end")
            assert editor.cursor_location == editor.document.end
            await pilot.press("ctrl+home")
            assert editor.cursor_location == (0, 0)
            await pilot.press("escape")
            assert isinstance(app.focused, Heatmap), pane


@pytest.mark.parametrize("pane", PANES)
async def test_the_screen_keys_work_from_each_pane(pane, tmp_path):
    app = make_app(texts=TEXTS[:2], tmp_path=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        for key, screen in (("M", PromptScreen), ("ctrl+o", PromptScreen), ("ctrl+s", PromptScreen),
                            ("R", RemediesScreen), ("S", SweepScreen), ("question_mark", HelpScreen),
                            ("f1", HelpScreen)):  # fmt: skip
            await _pressed_from(pilot, app, pane, key)
            assert isinstance(app.screen, screen), (pane, key)
            # Over another screen the explorer's keys do nothing: `d` is the prompt's letter, or ignored.
            settings = app.state.settings
            if screen is not PromptScreen:
                await pilot.press("d", "n", "b")
                assert app.state.settings == settings and isinstance(app.screen, screen), (pane, key)
            await pilot.press("escape")
            assert not isinstance(app.screen, screen), (pane, key)
        await _pressed_from(pilot, app, pane, "I")
        status = app.query_one(StatusLine)
        await wait_for(pilot, lambda: "torch" in status.full_text(), "the fingerprint")
        await _pressed_from(pilot, app, pane, "f8")
        await wait_for(pilot, lambda: list(tmp_path.glob("batchtui-screenshot-*.svg")), "a screenshot")
