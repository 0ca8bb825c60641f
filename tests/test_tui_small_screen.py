"""At 80x24 everything the app shows is readable or reachable, with a hint where something is scrolled away."""

from __future__ import annotations

from tui_helpers import make_app, settle

from batchtui.tui.heatmap import Heatmap
from batchtui.tui.layers import LayersPane
from batchtui.tui.settings_panel import CHECKBOXES, OnOffCheckbox

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


async def test_a_cut_top_k_table_says_where_it_is():
    from batchtui.core import DEFAULT_TEXTS

    app = make_app(texts=list(DEFAULT_TEXTS), model="qwen2-english-4m")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("w")  # the worst flip: its numbers take the most lines
        await pilot.pause(0.2)
        detail = app.query_one("#detail")
        topk = app.query_one("#detail-topk")
        cut = topk.region.bottom > detail.parent.content_region.bottom
        assert str(detail.border_title).endswith("· top-k: t") == cut


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
