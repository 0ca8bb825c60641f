"""The app's explain-and-remedy parts: module view, decomposition, remedies and sweep screens."""

from helpers.tui_helpers import MIXED, make_app, measured_remedy, settle, wait_for
from textual.widgets import Checkbox, DataTable

from batchtui.tui.screens.remedies_screen import RemediesScreen
from batchtui.tui.screens.sweep_screen import SWEEP_BATCH_SIZES, SWEEP_DTYPES, SweepScreen
from batchtui.tui.widgets.layers import LayersPane


async def test_m_switches_the_layers_pane_to_modules():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.state.comparison.texts[0].modules == ()
        await pilot.press("m")
        await settle(pilot, app)
        assert app.state.comparison.config["modules"] is True
        assert str(app.query_one(LayersPane).border_title).startswith("modules · text 1")
        await pilot.press("m")
        assert str(app.query_one(LayersPane).border_title).startswith("layers · text 1")


async def test_decompose_checkbox_shows_both_effects_in_the_detail():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        app.query_one("#decompose", Checkbox).value = True
        await wait_for(pilot, lambda: app.state.settings.decompose, "the setting to start a run")
        await settle(pilot, app)
        assert app.state.settings.decompose and app.state.comparison.texts[0].decomposition is not None
        await pilot.press("]", "]")
        shown = str(app.query_one("#detail-numbers").render())
        assert "batch-size effect" in shown and "padding effect" in shown


async def test_remedies_screen_measures_before_and_after():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        screen = await measured_remedy(pilot, app, "float32")
        assert screen.query_one(DataTable).row_count == 2
        await pilot.press("escape")
        assert not isinstance(app.screen, RemediesScreen)


async def test_sweep_screen_fills_the_matrix_and_chart():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("S", "enter")
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await wait_for(pilot, lambda: screen.cells is not None, "the sweep")
        assert len(screen.cells) == len(SWEEP_DTYPES) * len(SWEEP_BATCH_SIZES)
        assert screen.query_one(DataTable).row_count == len(screen.cells)
        assert all(c.texts == len(MIXED) for c in screen.cells)
        await pilot.press("escape")
        assert not isinstance(app.screen, SweepScreen)
        await pilot.press("S")  # reopened on the same texts and settings: the finished sweep, not a new one
        await pilot.pause()
        again = app.screen
        assert isinstance(again, SweepScreen) and again.cells is screen.cells
        assert not again.workers and again.query_one(DataTable).row_count == len(screen.cells)
        await pilot.press("escape", "p")  # other settings: a sweep of its own
        await settle(pilot, app)
        await pilot.press("S")
        fresh = app.screen
        assert fresh.cells is None  # not run until asked
        await pilot.press("enter")
        await wait_for(pilot, lambda: fresh.cells is not None, "the new sweep")
        assert fresh.cells is not screen.cells and {c.padding_side for c in fresh.cells} == {"right"}


async def test_main_screen_keys_do_nothing_over_another_screen():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("R")
        before = app.state.selected, app.state.settings
        await pilot.press("n", "]", "d", "p", "b", "e")
        assert isinstance(app.screen, RemediesScreen) and app.is_running
        assert (app.state.selected, app.state.settings) == before


async def test_the_remedies_marks_say_which_are_selected_and_none_is_left_out_without_a_word():
    from batchtui.core.experiments.remedies import REMEDIES

    app = make_app(texts=["a", "bc"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("R")
        screen = app.screen
        choices = screen.query_one("#remedy-list")
        await pilot.pause()

        def marks() -> list[str]:
            return [choices.render_line(y).text[1] for y in range(len(REMEDIES))]

        assert marks() == ["✓"] * len(REMEDIES)  # every one selected, a CUDA-only one too
        choices.deselect("float32")
        await pilot.pause()
        assert marks()[list(REMEDIES).index("float32")] == " " and "X" not in "".join(marks())
        choices.select("float32")
        await pilot.press("r")
        await wait_for(pilot, lambda: screen.outcomes is not None, "remedies")
        cuda_only = [o for o in screen.outcomes if o.name == "tf32-off"]
        assert cuda_only and not cuda_only[0].applied and "CUDA-only" in cuda_only[0].note
        table = screen.query_one(DataTable)
        assert any("CUDA-only: no effect on cpu" in str(cell) for row in range(table.row_count)
                   for cell in table.get_row_at(row))  # fmt: skip


async def test_the_remedies_screen_says_which_kernel_class_the_difference_comes_from():
    from batchtui.core.settings import KERNEL_CLASSES

    app = make_app(texts=["a", "The quick brown fox jumps over it", "hello world"], dtype="float32")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("R", "k")
        screen = app.screen
        await wait_for(pilot, lambda: screen.kernels is not None, "the kernel classes")
        table = screen.query_one(DataTable)
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == list(KERNEL_CLASSES)
        assert str(screen.query_one("#remedy-status").render()).startswith("as configured: ")
