"""SVG snapshots of the main screen at 80x24 and 120x40 (at rest, on a flip, on a long text) and of the
help screen.

Batch size 1 makes every difference bitwise zero, and the flips are those of a deliberately batch-variant
model in float64 (`batch_variant`), so the pictures do not depend on the CPU's kernels; the run time in
the status line is pinned, being the one thing that varies.
"""

from pathlib import Path

import pytest
from helpers.tui_helpers import batch_variant, make_app, settle

from batchtui.core import DEFAULT_TEXTS, Settings


def app_for_snapshot():
    return make_app(batch_size=1, tmp_path=Path("reports"))  # named on the help screen: fixed, not the cwd


async def _ready(pilot) -> None:
    await settle(pilot, pilot.app)
    pilot.app.show_status(last_run_s=0.0)  # the run's time: not the machine's
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_main_screen(snap_compare, size):
    assert snap_compare(app_for_snapshot(), terminal_size=size, run_before=_ready)


def test_main_screen_after_moving(snap_compare):
    async def move(pilot):
        await _ready(pilot)
        await pilot.press("]", "]", "right", "right")
        await pilot.pause(0.2)

    assert snap_compare(app_for_snapshot(), terminal_size=(120, 40), run_before=move)


LONG = "The quick brown fox jumps over the lazy dog. " * 14  # 630 tokens: wider than any heatmap


def _on_the_worst_flip(*keys):
    async def run_before(pilot):
        await _ready(pilot)
        await pilot.press("w", *keys)
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_on_a_flip(snap_compare, size):
    with batch_variant(Settings(model="tiny", dtype="float64")):
        app = make_app(list(DEFAULT_TEXTS), tmp_path=Path("reports"), dtype="float64", positions="mask")
        assert snap_compare(app, terminal_size=size, run_before=_on_the_worst_flip())


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_on_a_long_text(snap_compare, size):
    with batch_variant(Settings(model="tiny", dtype="float64")):
        app = make_app(["a", LONG, "Hello, world!"], tmp_path=Path("reports"), dtype="float64", positions="mask")
        assert snap_compare(app, terminal_size=size, run_before=_on_the_worst_flip())


def test_help_screen(snap_compare):
    async def help_(pilot):
        await _ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app_for_snapshot(), terminal_size=(80, 24), run_before=help_)


async def _failed_run(pilot) -> None:
    """A run that fails for real (a model folder that is not there) after one that succeeded."""
    await _ready(pilot)
    app = pilot.app
    app.apply_settings(app.state.settings.with_changes(model="./no-such-model"))
    await settle(pilot, app)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_status_line_with_an_error(snap_compare, size):
    assert snap_compare(app_for_snapshot(), terminal_size=size, run_before=_failed_run)
