"""The generation view (`c`): every text's split or `same`, both continuations with the split marked, the
per-step curve and the split's top-k; re-run after each comparison, stale runs never shown."""

from __future__ import annotations

from helpers.tui_helpers import batch_variant, make_app, settle, wait_for
from textual.widgets import DataTable

from batchtui.core import Settings
from batchtui.core.visible import literal
from batchtui.tui.screens.help_screen import HelpScreen
from batchtui.tui.views.generation_screen import continuation_tokens
from batchtui.tui.widgets.generation_pane import GenerationPane
from batchtui.tui.widgets.heatmap import Heatmap
from batchtui.tui.widgets.status_line import StatusLine
from batchtui.tui.widgets.texts_editor import TextsEditor

TEXTS = ["a", "The quick brown fox jumps over the lazy dog.", "Hello, world!"]


async def _generated(pilot, app) -> None:
    await wait_for(
        pilot,
        lambda: app.state.generated is not None and app.state.generated[0] == app.state.run_number,
        "the generation",
    )


async def test_one_key_shows_for_every_text_whether_and_where_batching_changed_the_answer():
    with batch_variant(Settings(model="tiny", dtype="float64"), amplitude=2e-3):
        app = make_app(texts=TEXTS, dtype="float64", positions="mask")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("c")
            pane = app.query_one(GenerationPane)
            assert pane.display and not app.query_one(Heatmap).display
            await _generated(pilot, app)
            result = app.state.generated[1]
            assert result.summary.differ >= 1  # the ripple makes batched rows choose otherwise
            table = pane.query_one(DataTable)
            assert table.row_count == len(TEXTS)
            for row, t in enumerate(result.texts):
                split = str(table.get_row_at(row)[1])
                assert split == "same" if t.split_step is None else split.startswith(str(t.split_step))
            assert "continuations differ" in app.query_one(StatusLine).full_text()
            verdict = str(pane.query_one("#gen-verdict").content)
            assert f"{result.summary.differ} of {len(TEXTS)} continuations differ" in verdict
            # The first differing token is marked in both continuations, the shared prefix dim.
            text = next(i for i, t in enumerate(result.texts) if t.differs)
            await pilot.press(*["down"] * text)
            assert app.state.selected[0] == text
            for run in ("single", "batched"):
                shown = pane.query_one(f"#gen-{run}").content  # the rich Text the pane built
                marked = [shown.plain[s.start : s.end] for s in shown.spans if "reverse" in str(s.style)]
                tokens = continuation_tokens(result.texts[text], run)
                assert marked == [literal(t.token) for t in tokens if t.state == "split"]
            topk = pane.query_one("#gen-topk").content  # the split's top-k, in the detail's form
            assert [c.header for c in topk.columns] == ["#", "batched", "logit", "single", "logit"]
            assert topk.row_count == len(result.texts[text].split.topk_single) == app.state.settings.top_k
            await pilot.press("c")
            assert app.query_one(Heatmap).display and not pane.display


async def test_an_edit_runs_the_comparison_then_the_generation_again_and_stale_ones_never_show():
    app = make_app(texts=TEXTS, dtype="float32")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await _generated(pilot, app)
        first = app.state.generated
        assert [t.text for t in first[1].texts] == TEXTS
        editor = app.query_one(TextsEditor)
        editor.text = "one more\nand another"
        app.action_rerun()
        await settle(pilot, app)
        await _generated(pilot, app)
        assert app.state.generated[0] == app.state.run_number > first[0]
        assert [t.text for t in app.state.generated[1].texts] == ["one more", "and another"]
        assert app.query_one(GenerationPane).query_one(DataTable).row_count == 2


async def test_generation_key_is_in_the_help_and_palette():
    app = make_app(texts=TEXTS[:1])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert any(b.action == "app.toggle_generation" and b.key == "c" for b in app.screen.BINDINGS)
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert "Continuations" in commands
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)


async def test_opening_and_closing_the_generation_view_keeps_the_selected_text():
    for size in ((80, 24), (120, 40)):
        app = make_app(texts=TEXTS, dtype="float32")
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app)
            await pilot.press("]", "]", "right")
            before = app.state.selected
            assert before[0] == 2
            await pilot.press("c")
            await _generated(pilot, app)
            await pilot.pause(0.2)
            assert app.state.selected[0] == 2 and app.query_one(GenerationPane).table.cursor_row == 2
            await pilot.press("c")
            await pilot.pause(0.2)
            assert app.state.selected == before and app.query_one(Heatmap).display


async def test_at_80x24_the_verdict_is_whole_and_the_text_s_checks_in_view():
    """On the smallest screen the generation's verdict wraps whole (a border title was cut) and the selected text's
    checks (decode vs prefill, trainer vs sampler) sit inside the pane's visible region, not below it."""
    app = make_app(texts=TEXTS, dtype="float32")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await _generated(pilot, app)
        await pilot.pause(0.2)
        pane = app.query_one(GenerationPane)
        result = app.state.generated[1]
        verdict = str(pane.query_one("#gen-verdict").content)
        assert verdict and f"of {len(TEXTS)} continuations" in verdict and "…" not in verdict
        checks = pane.query_one("#gen-checks")
        assert checks.display and "trainer vs sampler" in str(checks.content)
        visible = pane.content_region
        assert visible.y <= checks.region.y and checks.region.bottom <= visible.bottom, (checks.region, visible)
        assert pane.border_title == "generation" and result.texts
