"""The explorer on real prompts, driven through Pilot: the top-k chart, the worst flip, the overview of
long texts, many texts, visible focus, switching the model and loading a texts file, the sweep's grid."""

from __future__ import annotations

import json

from helpers.tui_helpers import MIXED, make_app, settle, wait_for
from textual.widgets import DataTable, Input
from textual_plotext import PlotextPlot

from batchtui.core.visible import shown_token
from batchtui.tui.screens.prompt_screen import PromptScreen
from batchtui.tui.screens.sweep_screen import SweepScreen
from batchtui.tui.views.heatmap_cells import overview_span
from batchtui.tui.views.navigation import flip_cells, worst_flip
from batchtui.tui.views.tokens import topk_union
from batchtui.tui.widgets.heatmap import FLIP_MARKER, SELECTED_MARKER, Heatmap, HeatmapPlot
from batchtui.tui.widgets.layers import LayersPane
from batchtui.tui.widgets.settings_panel import OnOffCheckbox
from batchtui.tui.widgets.texts_editor import TextsEditor
from batchtui.tui.widgets.topk_pane import TopkPane

LONG = "The quick brown fox jumps over the lazy dog. " * 12  # 540 tokens: wider than the heatmap
FLIPPING = ["a", LONG, "Hello, world! How are you today?", "xyz"]


def _figure(app) -> list[str]:
    return str(app.query_one(HeatmapPlot).render()).split("\n")


def _chart_text(widget) -> str:
    return str(widget.render())


async def test_worst_flip_key_and_the_top_k_chart_of_both_runs():
    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert flip_cells(app.state.comparison)
        await pilot.press("w")
        assert app.state.selected == worst_flip(app.state.comparison)
        pane = app.query_one(TopkPane)
        assert not pane.display and app.query_one(LayersPane).display
        await pilot.press("t")  # the chart takes the layers' place
        await pilot.pause(0.2)
        assert pane.display and not app.query_one(LayersPane).display
        text, position = app.state.selected
        assert f"text {app.state.comparison.texts[text].line} · position {position}" in pane.border_title
        chart = _chart_text(pane.query_one(PlotextPlot))
        # The views read one position at a time: they built no text's rows (an object per position, for every text).
        assert not any("positions" in vars(t) for t in app.state.comparison.texts)
        rows = topk_union(app.state.comparison.texts[text].positions[position])
        shown = [shown_token(row.token, 5)[:4] for row in rows[:3]]
        assert all(label in chart for label in shown), (shown, chart)  # the tokens label the axis
        await pilot.press("t")
        assert not pane.display and app.query_one(LayersPane).display


async def test_top_k_chart_at_80x24_takes_the_detail_place():
    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("w", "t")
        await pilot.pause(0.2)
        pane = app.query_one(TopkPane)
        assert pane.display and not app.query_one("#detail").display
        assert pane.region.height >= 8 and pane.region.right <= 80
        await pilot.press("L")  # back to the detail
        assert app.query_one("#detail").display and not pane.display


async def test_a_long_text_is_shown_whole_then_zoomed_to_the_selection():
    app = make_app(texts=["a", LONG])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        heatmap = app.query_one(Heatmap)
        longest = len(app.state.comparison.texts[1].positions)
        await pilot.press("j")
        assert f"all {longest}, " in heatmap.border_subtitle and "/cell" in heatmap.border_subtitle
        span = heatmap._span
        assert span == overview_span(longest, heatmap._columns()) > 1
        await pilot.press("right")  # a step is a cell in the overview
        assert app.state.selected == (1, span)
        await pilot.press("end")
        assert app.state.selected == (1, longest - 1)
        line = _figure(app)[2]  # text 2's row: the marker sits in the last cell
        label_width = len(str(max(t.line for t in app.state.comparison.texts)))
        assert line.index(SELECTED_MARKER) == label_width + 1 + (longest - 1) // span
        await pilot.press("z")  # zoom: one position per cell around the selection, the range named
        assert heatmap._span == 1
        subtitle = heatmap.border_subtitle
        assert f"of {longest}" in subtitle and f"–{longest - 1} " in subtitle
        await pilot.press("z")
        assert heatmap._span == span


async def test_first_frame_shows_every_text_and_the_marker_sits_on_its_cell():
    for count in (8, 12, 120):
        texts = [f"text {i} " + "word " * (i % 5) for i in range(count)]
        app = make_app(texts=texts)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)

            plot = app.query_one(HeatmapPlot)

            def all_rows_drawn(app=app, plot=plot, count=count) -> bool:
                return sum("┤" in line for line in _figure(app)) >= min(count, plot.size.height - 3)

            # Every row in view is drawn once the heatmap is laid out to the comparison's texts (the layout
            # comes a frame after the result, later on a busy machine: waited for, not assumed).
            await wait_for(pilot, all_rows_drawn, "the rows in view")
            assert plot.size.height - 3 >= min(count, 8)
            # The marker on a flip in the zoomed view stands exactly where the flip's glyph was drawn.
            app.query_one(Heatmap).action_zoom()
            flips = flip_cells(app.state.comparison)
            if not flips:
                continue
            text, position = flips[len(flips) // 2]
            app.select(text, position)
            plot = app.query_one(HeatmapPlot)

            def changed_cells(plot=plot, app=app) -> list[tuple[int, int]]:
                bare, marked = str(plot._cache[1]).split("\n"), _figure(app)
                return [
                    (r, c) for r, (a, b) in enumerate(zip(bare, marked)) for c, (x, y) in enumerate(zip(a, b)) if x != y
                ]

            def marker_on_a_flip(plot=plot) -> bool:
                changed = changed_cells()
                return (
                    len(changed) == 1 and str(plot._cache[1]).split("\n")[changed[0][0]][changed[0][1]] == FLIP_MARKER
                )

            # Drawn a frame or more after the selection (later on a busy machine): waited for, not assumed.
            await wait_for(pilot, marker_on_a_flip, "the marker on the flip")
            bare = str(plot._cache[1]).split("\n")
            marked = _figure(app)
            changed = changed_cells()
            assert len(changed) == 1
            row, column = changed[0]
            assert bare[row][column] == FLIP_MARKER and marked[row][column] == SELECTED_MARKER
            assert bare[row].split("┤")[0].strip() == str(app.state.comparison.texts[text].line)


async def test_focus_and_checkboxes_are_visible_beyond_a_shade():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        box = app.query_one("#reference", OnOffCheckbox)
        assert "✓" not in str(box.render())
        box.focus()
        await pilot.press("space")
        await pilot.pause()
        assert box.value and "✓" in str(box.render())
        select = app.query_one("#dtype")
        before = select.query_one("SelectCurrent").styles.background
        select.focus()
        await pilot.pause()
        after = select.query_one("SelectCurrent").styles.background
        assert before != after and abs(before.brightness - after.brightness) > 0.05


async def test_a_failed_model_switch_keeps_the_model_the_session_and_the_texts(tmp_path):
    session = tmp_path / "session.json"
    app = make_app()
    app.session_path = session
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        source = app.query_one(TextsEditor).source()
        runs = app.state.run_number
        for bad, said in (
            (str(tmp_path / "no-such-model"), "no folder"),
            (str(tmp_path), "has no config.json"),
            ("not a model!", "neither a local folder nor a hub id"),
        ):
            await pilot.press("M")
            assert isinstance(app.screen, PromptScreen)
            app.screen.query_one(Input).value = bad
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            said_lines = [str(n.message) for n in app._notifications]
            assert any(said in line and "still on tiny" in line and "\n" not in line for line in said_lines), said_lines
            # Nothing moved: the model in use, its name in the panel, the session file, no new run.
            assert app.state.settings.model == "tiny" and app.state.comparison.config["model"] == "tiny"
            assert "model tiny" in str(app.query_one("#settings").border_title)
            assert json.loads(session.read_text())["settings"]["model"] == "tiny"
            assert app.state.run_number == runs
        assert app.query_one(TextsEditor).source() == source
        await pilot.press("M")
        app.screen.query_one(Input).value = "qwen2-english-4m"
        await pilot.press("enter")
        await settle(pilot, app)
        assert (
            app.state.settings.model == "qwen2-english-4m"
            and app.state.comparison.config["model"] == "qwen2-english-4m"
        )
        assert json.loads(session.read_text())["settings"]["model"] == "qwen2-english-4m"


async def test_a_texts_file_replaces_the_texts_keeping_its_line_numbers(tmp_path):
    texts = tmp_path / "prompts.txt"
    texts.write_text("first prompt\n\nthird prompt\n", encoding="utf-8")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        before = app.query_one(TextsEditor).source()
        await pilot.press("ctrl+o")
        app.screen.query_one(Input).value = str(tmp_path / "missing.txt")
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: any("cannot read texts file" in n.message for n in app._notifications), "the refusal"
        )
        assert app.query_one(TextsEditor).source() == before  # a bad file changes nothing
        await pilot.press("ctrl+o")
        app.screen.query_one(Input).value = str(texts)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.state.comparison and len(app.state.comparison.texts) == 2, "the file's run")
        await settle(pilot, app)
        assert [t.line for t in app.state.comparison.texts] == [1, 3]
        assert [t.text for t in app.state.comparison.texts] == ["first prompt", "third prompt"]


async def test_the_sweep_runs_on_enter_only_and_its_grid_is_set_on_the_screen():
    app = make_app(texts=MIXED[:2], attn=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("S")
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        dtypes = screen.query_one("#sweep-dtypes", Input)
        assert app.focused is dtypes and dtypes.value == "bfloat16,float16,float32"
        await pilot.pause(0.3)
        assert screen.cells is None and not app.workers  # opened, not run
        await pilot.press("tab")  # Tab leaves a field for the next one
        sizes = screen.query_one("#sweep-batch-sizes", Input)
        assert app.focused is sizes
        sizes.value = "1,x"
        await pilot.press("enter")
        assert any("batch sizes" in n.message for n in app._notifications) and screen.cells is None
        await pilot.press("shift+tab")
        assert app.focused is dtypes
        dtypes.value = "float32,bfloat16"
        sizes.value = "1,2"
        await pilot.press("enter")
        await pilot.press("end", "x")  # typed while the grid runs: kept in the field
        await wait_for(pilot, lambda: screen.cells is not None, "the grid")
        assert dtypes.value == "float32,bfloat16x"
        assert [(c.dtype, c.batch_size) for c in screen.cells] == [
            ("float32", 1),
            ("float32", 2),
            ("bfloat16", 1),
            ("bfloat16", 2),
        ]
        assert screen.query_one(DataTable).row_count == 4
        legend = str(screen.query_one("#sweep-legend").render())
        assert "float32" in legend and "bfloat16" in legend
        # One line sums the grid up, and the attention is named as the model resolved it.
        summary = str(screen.query_one("#sweep-status").render())
        assert summary.startswith(f"{sum(bool(c.diverged) for c in screen.cells)} of 4 cells diverge")
        assert "attn sdpa" in str(screen.query_one("#title").render())


async def test_per_module_view_labels_every_point():
    app = make_app(texts=[LONG, "Hello, world! How are you today?"], modules=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("j")  # the padded text: its modules diverge
        layers = app.query_one(LayersPane)
        assert layers.border_title.startswith("modules")
        chart = _chart_text(layers.query_one(PlotextPlot))
        assert all(mark in chart for mark in ("a", "m", "n", "L"))
        assert "a attn" in layers.legend and "diverges from model.layers.0" in layers.legend


async def test_a_fifo_given_as_texts_file_is_refused_and_the_app_stays_responsive(tmp_path):
    """Reading a FIFO nobody writes to would block the app's only thread (q and ctrl+c no longer quit)."""
    import os

    fifo = tmp_path / "texts.fifo"
    os.mkfifo(fifo)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        before = app.query_one(TextsEditor).source()
        await pilot.press("ctrl+o")
        app.screen.query_one(Input).value = str(fifo)
        await pilot.press("enter")
        await pilot.pause()
        assert any("is not a regular file" in n.message for n in app._notifications)
        assert app.query_one(TextsEditor).source() == before
        await pilot.press("q")
    assert app.return_code == 0


async def test_a_texts_file_read_in_its_thread_arrives_or_its_fault_is_said(tmp_path):
    """ctrl+o reads the file in a worker: its lines come back to the editor as a message; a file that is not UTF-8
    is said in one notification and the texts stay."""
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("first text\nsecond text\n")
    bad.write_bytes(b"ok\n\xff\xfe not utf-8\n")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        editor = app.query_one(TextsEditor)
        before = editor.source()
        for path in (bad, good):
            await pilot.press("ctrl+o")
            app.screen.query_one(Input).value = str(path)
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            if path is bad:
                await wait_for(pilot, lambda: any("is not valid UTF-8" in n.message for n in app._notifications), "")
                assert editor.source() == before
        await wait_for(pilot, lambda: editor.source() == "first text\nsecond text\n", "the good file's texts")
