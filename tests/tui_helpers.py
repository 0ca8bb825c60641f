"""Driving the app in tests: start it on the built-in model and wait for its comparisons."""

from __future__ import annotations

from batchtui.core import Settings
from batchtui.tui.app import BatchtuiApp

MIXED = ["a", "b", "The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def make_app(texts=None, tmp_path=None, **settings) -> BatchtuiApp:
    defaults = {"dtype": "bfloat16", "positions": "arange"}
    return BatchtuiApp(list(texts or MIXED), Settings(**{**defaults, **settings}), output_dir=tmp_path)


async def settle(pilot, app: BatchtuiApp, generation: int | None = None) -> None:
    """Wait until the comparison of `generation` (default: the latest) is on screen."""
    for _ in range(600):
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        wanted = app.generation if generation is None else generation
        if wanted > 0 and app.settled_generation == wanted and not app.workers:
            await pilot.pause()
            return
    raise AssertionError("no comparison arrived")


def detail_title(app: BatchtuiApp) -> str:
    return str(app.query_one("#detail").border_title)
