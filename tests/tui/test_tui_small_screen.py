"""At 80x24 everything the app shows is readable or reachable, with a hint where something is scrolled away."""

from __future__ import annotations

import pytest
from helpers.tui_helpers import make_app, settle, wait_for

from batchtui.tui.widgets.heatmap import Heatmap
from batchtui.tui.widgets.layers import LayersPane
from batchtui.tui.widgets.settings_panel import CHECKBOXES, OnOffCheckbox

EIGHT = [f"text number {i} " + "word " * i for i in range(8)]


async def test_hidden_heatmap_rows_are_named_and_reached():
    app = make_app(texts=EIGHT)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        heatmap = app.query_one(Heatmap)
        shown = app.query_one("HeatmapPlot").size.height - 3
        assert shown < 8  # not every row fits: the title says which are in view and that more exist
        assert heatmap.border_title.endswith(f"rows 1–{shown}/8↕")
        for _ in range(7):
            await pilot.press("down")
        assert app.state.selected[0] == 7 and heatmap.border_title.endswith(f"rows {8 - shown + 1}–8/8↕")
        assert len(heatmap.border_title) <= heatmap.size.width - 2  # the hint itself is never cut


async def test_settings_labels_token_strip_and_layer_legend_are_whole():
    app = make_app(texts=EIGHT, modules=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        for field, label in CHECKBOXES:
            box = app.query_one(f"#{field}", OnOffCheckbox)
            assert box.content_size.width >= len(label) + 4  # the box, its mark and the whole label
        strip = app.query_one("#detail-strip")
        assert strip.display and strip.size.height == 1 and str(strip.render()).strip()
        await pilot.press("L")  # the layers in the detail's place
        legend = app.query_one(LayersPane).legend
        assert "diverges from" in legend or "all bitwise equal" in legend
        assert "a attn" in legend and "= bitwise equal" in legend
        footer = " ".join(str(key.render()) for key in app.screen.query("FooterKey"))
        assert footer.lstrip().startswith("?/F1")  # help is the first key, so it shows on a narrow screen


async def test_a_detail_longer_than_its_pane_says_so_and_scrolls_to_its_end():
    """The worst flip with the modules measured: its numbers, the first op's cause and the top-k take more lines
    than 80x24 leaves. The title says so; Tab reaches the pane, End shows the top-k whole; no line is cut."""
    from batchtui.core import DEFAULT_TEXTS
    from batchtui.tui.widgets.detail import DetailPane

    app = make_app(texts=list(DEFAULT_TEXTS), model="qwen2-english-4m", modules=True, positions="mask")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("w")  # the worst flip (the module view names its first op)
        await settle(pilot, app)
        await pilot.pause(0.2)
        detail = app.query_one(DetailPane)
        assert detail.max_scroll_y > 0 and str(detail.border_title).endswith("· more ↓ (tab)")
        await pilot.press("tab")
        assert app.focused is detail
        await pilot.press("end")
        await wait_for(pilot, lambda: detail.scroll_y == detail.max_scroll_y, "the detail's end")  # (it glides)
        assert app.query_one("#detail-topk").region.bottom <= detail.region.bottom
        op = app.state.comparison.texts[app.state.selected[0]].first_op
        shown = " ".join(str(app.query_one("#detail-numbers").render()).split())
        assert op is not None and f"first parts at {op.op} in {op.module}: {op.cause()}" in shown  # wrapped, not cut


async def test_an_open_menu_stands_out_from_the_fields_it_covers():
    """At 80x24 the dtype menu opens over the fields below it: framed, and lighter by more than a shade."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        app.query_one("#dtype").focus()
        await pilot.press("enter")
        await pilot.pause()
        overlay = app.query_one("#dtype").query_one("SelectOverlay")
        field = app.query_one("#padding_side")
        covered = field.query_one("SelectCurrent").styles.background
        assert overlay.display and overlay.region.overlaps(field.region)
        assert abs(overlay.styles.background.brightness - covered.brightness) > 0.1
        assert overlay.styles.border_top[0] != ""


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_fingerprint_is_seen_whole_at_80_and_120_columns(size):
    """The status line is full at these widths: `I` also says the fingerprint in a notification, which wraps."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        await pilot.press("I")
        await wait_for(pilot, lambda: any(n.title == "fingerprint" for n in app._notifications), "the fingerprint")
        said = next(n.message for n in app._notifications if n.title == "fingerprint")
        assert "torch" in said and said in app.explorer.status.full_text()


async def test_t_and_l_toggle_as_they_say_and_t_twice_puts_back_what_was_there():
    """Short: the one slot shows the detail, L the layers, t the top-k chart; t again brings back what it covered,
    L from the chart the detail. Tall: t swaps the layers and the chart, L says both are in view."""

    def in_view(app) -> list[str]:
        return [name for name in ("detail", "layers", "topk") if app.query_one(f"#{name}").display]

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        seen = [in_view(app)]
        for key in ("t", "t", "L", "t", "t", "L", "t", "L"):
            await pilot.press(key)
            await pilot.pause()
            seen.append(in_view(app))
        assert seen == [["detail"], ["topk"], ["detail"], ["layers"], ["topk"], ["layers"], ["detail"], ["topk"],
                        ["detail"]]  # fmt: skip
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        seen = [in_view(app)]
        for key in ("t", "t", "L"):
            await pilot.press(key)
            await pilot.pause()
            seen.append(in_view(app))
        assert seen == [["detail", "layers"], ["detail", "topk"], ["detail", "layers"], ["detail", "layers"]]
