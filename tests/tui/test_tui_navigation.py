"""Moving over the results in the app (the explorer screen's keys, the heatmap and the summary): positions, texts,
divergences, flips, sorting, and what the status line says on the way."""

from helpers.tui_helpers import detail_title, make_app, settle, wait_for

from batchtui.core.terminal.plain import decimals_to_tell_apart
from batchtui.tui.views.heatmap_cells import divergent_cells
from batchtui.tui.views.navigation import flip_cells, next_divergent, next_flip
from batchtui.tui.widgets.status_line import StatusLine
from batchtui.tui.widgets.summary_table import SummaryTable

LONG = "The quick brown fox jumps over the lazy dog. " * 12  # 540 tokens on the byte-level model


FLIPPING = ["a", LONG, "Hello, world! How are you today?", "xyz"]


def _status(app) -> str:
    return app.query_one(StatusLine).full_text()


async def test_n_jumps_over_divergent_positions_and_detail_follows():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        cells = divergent_cells(app.state.comparison)
        assert len(cells) > 1, "the test needs divergence: bf16 with arange positions and left padding"
        await pilot.press("n")
        assert app.state.selected == next_divergent(app.state.comparison, 0, 0) == cells[0]
        assert detail_title(app) == f"text {cells[0][0] + 1} · position {cells[0][1]}"
        await pilot.press("n")
        assert app.state.selected == cells[1]
        await pilot.press("N")
        assert app.state.selected == cells[0]
        await pilot.press("N")
        assert app.state.selected == cells[-1]  # wraps around


async def test_arrows_hjkl_and_brackets_move_the_selection():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("]", "]")
        assert app.state.selected == (2, 0) and detail_title(app) == "text 3 · position 0"
        await pilot.press("right", "right", "l")
        assert detail_title(app) == "text 3 · position 3"
        await pilot.press("h", "up")
        assert app.state.selected == (1, 0)  # text 2 has one token: the position is clamped
        await pilot.press("j", "down", "down", "down")
        assert app.state.selected == (3, 0)  # stops at the last text
        await pilot.press("[")
        assert app.state.selected == (2, 0)
        assert app.query_one(SummaryTable).cursor_row == 2


async def test_selecting_a_summary_row_selects_the_text():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        app.query_one(SummaryTable).focus()
        await pilot.press("down", "down", "down")
        assert app.state.selected[0] == 3
        assert detail_title(app).startswith("text 4 ·")


async def test_selection_survives_a_rerun():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("n")
        selected = app.state.selected
        assert selected != (0, 0)
        await pilot.press("r")
        await settle(pilot, app)
        assert app.state.selected == selected
        assert detail_title(app) == f"text {selected[0] + 1} · position {selected[1]}"


async def test_flip_keys_walk_every_flip_across_texts_and_say_it_in_words():
    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        flips = flip_cells(app.state.comparison)
        assert len(flips) >= 2 and len({text for text, _ in flips}) >= 1
        seen = []
        for _ in flips:
            await pilot.press("f")
            seen.append(app.state.selected)
        assert seen == flips  # in reading order, across texts
        await pilot.press("f")
        assert app.state.selected == flips[0]  # wraps
        await pilot.press("F")
        assert app.state.selected == flips[-1] == next_flip(app.state.comparison, *flips[0], forward=False)
        position = app.state.comparison.texts[app.state.selected[0]].positions[app.state.selected[1]]
        shown = str(app.query_one("#detail-numbers").render())
        batched, single = position.topk_batch[0], position.topk_single[0]
        # As many decimals as tell the top logits apart: a near-tie never reads "11.19 vs 11.19".
        logits = [t.logit for t in (*position.topk_batch[:2], *position.topk_single[:2])]
        decimals = decimals_to_tell_apart(logits, least=3)
        assert f"TOP-1 FLIP: batched → {batched.token!r} {batched.logit:.{decimals}f}" in shown
        assert f"single → {single.token!r} {single.logit:.{decimals}f}" in shown
        assert ("near-tie" in shown) == position.near_tie


async def test_no_flip_is_said_not_silent():
    app = make_app(texts=["one", "two"], batch_size=1)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("f")
        assert app.state.selected == (0, 0)
        assert any("no top-1 flip" in n.message for n in app._notifications)


async def test_home_end_and_pages_within_a_long_text():
    app = make_app(texts=["a", LONG])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        last = len(app.state.comparison.texts[1].positions) - 1
        await pilot.press("j", "end")
        assert app.state.selected == (1, last)
        await pilot.press("home")
        assert app.state.selected == (1, 0)
        await pilot.press("G")
        assert app.state.selected == (1, last)
        await pilot.press("g", "pagedown")
        page = app.state.selected[1]
        assert 20 < page < last  # a screenful of positions, not one
        await pilot.press("pagedown", "pageup")
        assert app.state.selected == (1, page)
        await pilot.press("pageup", "pageup")
        assert app.state.selected == (1, 0)  # clamped at the start


async def test_positions_and_attention_keys_change_the_run():
    app = make_app(texts=["one", "two three"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.state.settings.positions == "arange"
        await pilot.press("o")
        await settle(pilot, app)
        assert app.state.settings.positions == "mask" and app.state.comparison.config["positions"] == "mask"
        await pilot.press("a")
        await settle(pilot, app)
        assert app.state.settings.attn == "sdpa" and app.state.comparison.config["attn"] == "sdpa"
        await pilot.press("a")
        await settle(pilot, app)
        assert app.state.comparison.config["attn"] == "eager"


async def test_the_last_error_stays_until_a_run_succeeds():
    app = make_app(texts=["one", "two"], top_k=600)  # more than the vocabulary: the run fails
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot, app)
        assert "last run failed: top-k must be at most the vocabulary size 512" in _status(app)
        app.clear_notifications()
        await pilot.pause(1.2)  # the toast is gone; the line is not
        assert "last run failed" in _status(app)
        settings_panel = app.query_one("#settings")
        settings_panel._post(top_k=5)
        await settle(pilot, app)
        assert app.state.comparison is not None and "last run failed" not in _status(app)
        assert " s · " not in _status(app).split("last run")[0]  # no elapsed time once the run is over


async def test_status_says_the_effective_batch_size_and_what_reveals_a_divergence():
    app = make_app(texts=["one", "two"], batch_size=1, positions="mask")
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(pilot, app)
        assert "no divergence: right padding (p), arange positions (o)" in _status(app)
        assert "effective batch size" not in _status(app)
        await pilot.press("b", "b", "b")  # batch size 1 -> 2 -> 4 -> 8
        await settle(pilot, app)
        assert app.state.settings.batch_size == 8
        assert "effective batch size 2 (of 8: 2 texts)" in _status(app)


async def test_flips_are_marked_on_the_heatmap_and_in_its_legend():
    from batchtui.tui.views.heatmap_cells import heatmap_series
    from batchtui.tui.widgets.heatmap import FLIP_MARKER, HeatmapPlot

    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        flips = flip_cells(app.state.comparison)
        marked = sorted(
            (y - 1, x) for s in heatmap_series(app.state.comparison) if s.flips for x, y in zip(s.positions, s.texts)
        )
        assert marked == flips and flips
        await pilot.press("f")  # the heatmap's window moves to the first flip
        await pilot.pause()
        assert FLIP_MARKER in str(app.query_one(HeatmapPlot).render())
        assert f"{FLIP_MARKER}\u00a0flip" in str(app.query_one("#legend").render())


async def test_summary_sorts_worst_first_and_a_row_selects_its_text():
    from batchtui.tui.widgets.summary_table import SummaryTable

    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        table = app.query_one(SummaryTable)
        lines = [t.line for t in app.state.comparison.texts]
        assert [int(str(table.get_row_at(r)[0])) for r in range(table.row_count)] == lines
        await pilot.press("s")  # worst max|Δ| first
        by_max = sorted(
            app.state.comparison.texts, key=lambda t: (-t.max_abs_diff, -t.top1_flips, t.allclose, -t.kl_max, t.index)
        )
        assert [int(str(table.get_row_at(r)[0])) for r in range(table.row_count)] == [t.line for t in by_max]
        assert "worst max|Δ| first" in str(table.border_title)
        table.focus()
        await pilot.pause()
        table.move_cursor(row=0)
        await pilot.pause()
        assert app.state.selected[0] == by_max[0].index  # the top row is the worst text, and selects it
        await pilot.press("s")  # flips
        by_flips = sorted(
            app.state.comparison.texts, key=lambda t: (-t.top1_flips, t.allclose, -t.max_abs_diff, -t.kl_max, t.index)
        )
        assert [int(str(table.get_row_at(r)[0])) for r in range(table.row_count)] == [t.line for t in by_flips]
        # No allclose text above a divergent one among texts of as many flips.
        rows = [app.state.comparison.texts[table.text_at(r)] for r in range(table.row_count)]
        assert [(-t.top1_flips, t.allclose) for t in rows] == sorted((-t.top1_flips, t.allclose) for t in rows)


async def test_a_flip_at_80x24_shows_every_column():
    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("f")
        await pilot.pause()
        detail = app.query_one("#detail")
        position = app.state.comparison.texts[app.state.selected[0]].positions[app.state.selected[1]]
        numbers = app.query_one("#detail-numbers")
        shown = str(numbers.render())
        assert f"TOP-1 FLIP: batched → {position.topk_batch[0].token!r}" in shown
        # Packed into lines of the pane's width between items: nothing runs past it, no number is split.
        lines = shown.splitlines()
        assert all(len(line) <= detail.content_size.width for line in lines)
        assert numbers.size.height == len(lines)  # every line in view
        logit = f"{position.topk_single[0].logit:.3f}"[:-1]
        assert any(logit in line for line in lines)
        table = app.query_one("#detail-topk")
        assert table.content_size.width <= detail.content_size.width
        screen = ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]
        row = next(line for line in screen if line.rstrip().endswith(f"{position.topk_single[0].logit:.2f}"))
        assert f"{position.topk_batch[0].logit:.2f}" in row  # rank 1: both runs' logits on screen, none cut


async def test_resizing_to_80x24_refits_the_summary():
    from batchtui.tui.widgets.summary_table import SummaryTable

    app = make_app(texts=FLIPPING)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        table = app.query_one(SummaryTable)
        assert [str(c.label) for c in table.columns.values()][:3] == ["#", "text", "tok"]
        await pilot.resize_terminal(80, 24)
        narrow = ["#", "max|Δ|", "KL", "flips", "allclose"]
        await wait_for(pilot, lambda: [str(c.label) for c in table.columns.values()] == narrow, f"columns {narrow}")
        assert table.row_count == len(FLIPPING)
        assert str(table.get_row_at(1)[3]) == str(app.state.comparison.texts[1].top1_flips)  # the flips column
        assert table.virtual_size.width <= table.content_size.width  # nothing past the edge
        await pilot.resize_terminal(120, 40)
        wide = ["#", "text", "tok"]
        await wait_for(pilot, lambda: [str(c.label) for c in table.columns.values()][:3] == wide, f"columns {wide}")


async def test_moving_over_positions_stops_the_ui_for_a_full_collection_once_at_most():
    """A full garbage collection holds the UI for ~0.25 s. With the collector as the app's process sets it, 60 key
    presses along the texts see one at most (Python's default: about one every 15)."""
    import gc

    from batchtui.tui.launcher import fewer_full_collections

    full_collections = 0

    def counted(phase: str, info: dict) -> None:
        nonlocal full_collections
        full_collections += phase == "stop" and info["generation"] == 2

    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's default, whatever the test process uses
    fewer_full_collections()
    app = make_app(texts=[f"text {i} " + "word " * (i % 7) for i in range(30)])
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            gc.callbacks.append(counted)
            for press in range(60):
                await pilot.press("j" if press % 10 == 0 else "l")
            assert app.state.selected[0] == 6  # six texts down, moved along each
    finally:
        if counted in gc.callbacks:
            gc.callbacks.remove(counted)
        gc.set_threshold(*saved)
    assert full_collections <= 1, f"{full_collections} full collections"
