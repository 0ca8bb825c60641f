"""The status line in the app: the most important first at any width, the rest on the help screen."""

from __future__ import annotations

from helpers.tui_helpers import make_app, settle

from batchtui.tui.screens.help_screen import HelpScreen
from batchtui.tui.views.status import MORE
from batchtui.tui.widgets.status_line import StatusLine


async def test_an_error_leads_the_status_line_and_the_help_screen_has_the_rest():
    for size in ((80, 24), (120, 40)):
        app = make_app(batch_size=1)  # no divergence: the status carries its long hint
        async with app.run_test(size=size) as pilot:
            await settle(pilot, app)
            status = app.query_one(StatusLine)
            whole = status.full_text()
            assert "no divergence" in whole and "last run" in whole
            app.apply_settings(app.state.settings.with_changes(model="./no-such-model"))
            await settle(pilot, app)
            line = str(status.render())
            assert line.startswith("last run failed: no folder './no-such-model'")
            assert len(line) <= size[0] - 2 and line.endswith(MORE)
            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)
            shown = str(app.screen.query_one("#help-status").render())
            assert "no folder './no-such-model'" in shown and "last run" in shown


async def test_the_status_names_the_dtype_of_the_run_going_on_and_auto_as_what_it_became():
    app = make_app(dtype="auto")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        status = app.query_one(StatusLine)
        assert "bfloat16 (auto)" in status.full_text()  # what the built-in tiny model is saved in
        dtype = app.query_one("#dtype")
        assert "auto (bf16)" in str(dtype.query_one("SelectCurrent").label)
        await pilot.press("d")  # the next dtype: named from the moment its run starts
        assert app.state.settings.dtype in status.full_text()
        await settle(pilot, app)


async def test_a_run_waiting_for_the_previous_one_says_so_and_runs_once_its_turn_comes():
    from helpers.tui_helpers import wait_for

    from batchtui.core.one_run import one_run_at_a_time

    app = make_app(texts=["one", "two"])
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot, app)
        status = app.query_one(StatusLine)
        with one_run_at_a_time():  # another run's turn (the older one finishing its pass)
            await pilot.press("b")
            await wait_for(pilot, lambda: "waiting for the previous run to stop" in status.full_text(), "the wait")
            assert app.state.settled_run < app.state.run_number
        await settle(pilot, app)
        assert app.state.comparison.config["batch_size"] == app.state.settings.batch_size
        assert "waiting" not in status.full_text()


async def test_the_mode_s_first_measuring_is_said_in_the_status_line_as_it_goes(monkeypatch, tmp_path):
    """No kept measurements: turning the mode on measures its kernels in the first passes, and the status line says
    what it measures and how many are done (never a bare pass count that looks like a hang)."""
    from helpers.tui_helpers import wait_for

    from batchtui.core.invariant import linear, measured_store, mode, rows
    from batchtui.core.invariant.compiled_kernels import SWITCH

    monkeypatch.setenv(SWITCH, "0")  # the measured paths (the compiled kernels measure nothing)
    store = measured_store.MeasuredStore(tmp_path)
    monkeypatch.setattr(rows, "store", store)
    monkeypatch.setattr(mode, "store", store)
    monkeypatch.setattr(rows, "_measured", {})
    monkeypatch.setattr(rows, "_chosen", {})
    linear.forget_layer_paths()
    app = make_app(texts=["one", "two three"])
    said: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        progress = app.runs._progress
        monkeypatch.setattr(app.runs, "_progress", lambda run, label: said.append(label) or progress(run, label))
        await pilot.press("i")
        await settle(pilot, app)
        await wait_for(pilot, lambda: app.state.comparison.config["invariant"], "the mode's run")
    measuring = [label for label in said if label.startswith("measuring the mode's kernels on this machine (once)")]
    counts = [int(label.rsplit(", ", 1)[1].removesuffix(" done")) for label in measuring]
    assert counts and counts == list(range(counts[0], counts[0] + len(counts))), said  # one more each time
    assert "linear" in " ".join(measuring)
    assert store.path.exists()  # kept for the next process
