"""Driving the app in tests: start it on the built-in model and wait for its comparisons."""

from __future__ import annotations

from contextlib import contextmanager

from batchtui.core import Settings
from batchtui.tui.app import BatchtuiApp

MIXED = ["a", "b", "The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def make_app(texts=None, tmp_path=None, **settings) -> BatchtuiApp:
    defaults = {"model": "tiny", "dtype": "bfloat16", "positions": "arange"}  # the fast random built-in
    return BatchtuiApp(list(texts or MIXED), Settings(**{**defaults, **settings}), output_dir=tmp_path)


async def settle(pilot, app: BatchtuiApp, run_number: int | None = None) -> None:
    """Wait until the comparison of run `run_number` (default: the latest) is on screen."""
    for _ in range(600):
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        wanted = app.state.run_number if run_number is None else run_number
        if wanted > 0 and app.state.settled_run == wanted and not app.workers:
            await pilot.pause()
            return
    raise AssertionError("no comparison arrived")


async def wait_for(pilot, condition, what: str) -> None:
    """Wait until `condition()` holds (a screen's sweep, a file's run), or fail naming `what`."""
    for _ in range(600):
        await pilot.pause(0.05)
        if condition():
            await pilot.pause()
            return
    raise AssertionError(f"timed out waiting for {what}")


async def measured_remedy(pilot, app: BatchtuiApp, remedy: str):
    """Open the remedies screen (`R`), measure `remedy` alone against the baseline (`r`) and wait for both
    outcomes; the screen."""
    from batchtui.tui.screens.remedies_screen import RemediesScreen

    await pilot.press("R")
    screen = app.screen
    assert isinstance(screen, RemediesScreen)
    choices = screen.query_one("#remedy-list")
    choices.deselect_all()
    choices.select(remedy)
    await pilot.press("r")
    await wait_for(pilot, lambda: screen.outcomes is not None, "remedies")
    assert [o.name for o in screen.outcomes] == ["none", remedy]
    return screen


def detail_title(app: BatchtuiApp) -> str:
    return str(app.query_one("#detail").border_title)


@contextmanager
def batch_variant(settings: Settings, amplitude: float = 1e-3):
    """The built-in model, loaded as the app will load it, made batch-variant on purpose: rows of a batch
    of two or more get a fixed ripple added to their embeddings. In float64 its flips are the ripple's
    doing, not the CPU's rounding, so a picture of a flip is the same on every machine."""
    import torch

    from batchtui.core.models.loading import load_model

    def ripple(module, args, output):
        if output.shape[0] > 1:
            position = torch.arange(output.shape[1], dtype=output.dtype)[:, None]
            feature = torch.arange(output.shape[2], dtype=output.dtype)[None, :]
            return output + amplitude * torch.sin(0.37 * position + feature)
        return None

    handle = load_model(settings).model.get_input_embeddings().register_forward_hook(ripple)
    try:
        yield
    finally:
        handle.remove()
