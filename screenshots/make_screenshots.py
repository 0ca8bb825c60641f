"""Regenerate the README's screenshots from the real app on the built-in model.

    python screenshots/make_screenshots.py

Runs bf16 with the original report's `arange` position ids, where the tiny model diverges on CPU.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from batchtui.core import DEFAULT_TEXTS, Settings
from batchtui.tui.app import BatchtuiApp

HERE = Path(__file__).parent
SETTINGS = Settings(dtype="bfloat16", positions="arange")


async def _settled(pilot, app: BatchtuiApp) -> None:
    for _ in range(600):
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        if app.state.run_number and app.state.settled_run == app.state.run_number and not app.workers:
            await pilot.pause(0.3)
            return
    raise RuntimeError("no comparison arrived")


async def shoot(name: str, size: tuple[int, int], keys: list[str], texts=DEFAULT_TEXTS) -> Path:
    app = BatchtuiApp(list(texts), SETTINGS, output_dir=Path("reports"))  # as the help screen names it
    async with app.run_test(size=size) as pilot:
        await _settled(pilot, app)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)
        return Path(app.save_screenshot(filename=f"{name}.svg", path=str(HERE)))


async def main() -> None:
    shots = [
        ("main", (120, 40), ["n"]),
        ("flip", (120, 40), ["w", "t"]),  # the worst flip, with its top-k chart
        ("small", (80, 24), ["w"]),
        ("help", (100, 30), ["question_mark"]),
    ]
    for name, size, keys in shots:
        print(await shoot(name, size, keys))


if __name__ == "__main__":
    asyncio.run(main())
