"""Soak the app: 300 edits through Pilot, then print RSS growth and live threads.

    python scripts/soak.py [--edits 300]

Every edit types or deletes a character in the editor; every tenth waits for the re-run it triggers,
so comparisons start, are abandoned and finish many times over. Growing texts give every run a new
tensor shape, and torch's CPU kernels keep per-shape caches; --same-length separates that from leaks.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import threading


def rss_mib() -> float:
    """Resident memory after a GC and handing freed heap back (so fragmentation is not counted as growth)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


async def soak(edits: int, same_length: bool) -> None:
    # Typing x, x, backspace grows the text (every run a new shape); x, backspace keeps its length.
    period = 2 if same_length else 3
    from batchtui.core import DEFAULT_TEXTS, Settings
    from batchtui.tui.app import BatchtuiApp

    app = BatchtuiApp(list(DEFAULT_TEXTS), Settings(dtype="bfloat16", decompose=True, modules=True))
    async with app.run_test(size=(120, 40)) as pilot:
        while app.state.comparison is None:
            await pilot.pause(0.05)
        gc.collect()
        start_rss, start_threads = rss_mib(), threading.active_count()
        await pilot.press("e")
        for i in range(edits):
            await pilot.press("backspace" if i % period == period - 1 else "x")
            if i % 10 == 9:
                await pilot.pause(0.6)  # past the debounce: a run starts (r, if the text came back the same)
                if app.state.settled_run == app.state.run_number:
                    app.action_rerun()
                await app.workers.wait_for_complete()
                await pilot.pause()
            if i % 100 == 99:
                print(f"after {i + 1} edits: RSS {rss_mib():.1f} MiB, {len(gc.get_objects())} objects", flush=True)
        await pilot.pause(0.6)
        await app.workers.wait_for_complete()
        await pilot.pause()
        gc.collect()
        end_rss, end_threads = rss_mib(), threading.active_count()
        print(f"edits: {edits}, runs started: {app.state.run_number}, results shown: {app.state.settled_run}")
        print(f"RSS: {start_rss:.1f} MiB -> {end_rss:.1f} MiB (growth {end_rss - start_rss:+.1f} MiB)")
        print(f"live threads: {start_threads} -> {end_threads}")
        print(f"texts intact: {app.query_one('#editor').text.splitlines()[-1][:60]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=300)
    parser.add_argument("--same-length", action="store_true", help="edits that keep the text's length")
    args = parser.parse_args()
    asyncio.run(soak(args.edits, args.same_length))


if __name__ == "__main__":
    main()
