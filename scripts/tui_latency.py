"""How fast the app answers: time to the first frame, key-press latency while a comparison runs, and quit.

    python scripts/tui_latency.py [--presses 60] [--texts 48] [--tokens 270]

e.g. many short prompts, `--texts 1000 --tokens 32`, or a few long ones, `--texts 8 --tokens 4000`.

First frame: a child process starts the app (headless, 120x40) and reports the wall time at which
its first frame was drawn; counted from just before the child was spawned, interpreter start included.
Key latency: with a long comparison running in its worker, each press of a move key is timed from
posting the key until the heatmap has rendered the moved selection (the heatmap's render is wrapped
to count frames; Pilot's own press is not used, as it waits for the app to go idle, which a running
comparison's progress messages never let it). Quit: the real app in a pseudo-terminal, results on screen,
from writing `q` (and, in another start, ctrl+c) to the process's exit. Prints p50/p95/max and PASS/FAIL
against the targets, and what a Tab press costs the UI thread once the results are in (its CPU time per press,
median of 30: moving the focus restyles the panes it leaves and enters).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIRST_FRAME_LIMIT_S = 1.5
KEY_P95_LIMIT_S = 0.100
QUIT_LIMIT_S = 1.0

CHILD = """
import asyncio, sys, time
from batchtui.tui.app import BatchtuiApp
from batchtui.core import Settings
sys.path.insert(0, sys.argv[1])
from tui_latency import workload

async def main():
    app = BatchtuiApp(workload(int(sys.argv[2]), int(sys.argv[3])), Settings(model="tiny"))
    async with app.run_test(size=(120, 40)):
        print(time.time(), flush=True)

asyncio.run(main())
"""


def workload(n_texts: int, n_tokens: int) -> list[str]:
    """`n_texts` texts of `n_tokens` tokens each on the random `tiny` model, whose tokenizer is byte-level
    (so the counts are exact; the app is run on it)."""
    phrase = "the quick brown fox jumps over the lazy dog "
    return [(f"text number {i}: " + phrase * (n_tokens // len(phrase) + 1))[:n_tokens] for i in range(n_texts)]


def first_frame_seconds(n_texts: int, n_tokens: int) -> float:
    """From spawning a child that starts the app on the workload to its first frame."""
    started = time.time()
    here = str(Path(__file__).resolve().parent)
    child = [sys.executable, "-c", CHILD, here, str(n_texts), str(n_tokens)]
    done = subprocess.run(child, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[0]) - started


async def key_latencies(presses: int, n_texts: int, n_tokens: int) -> tuple[list[float], bool]:
    from batchtui.core import Settings
    from batchtui.tui.app import BatchtuiApp
    from batchtui.tui.launcher import fewer_full_collections
    from batchtui.tui.widgets.heatmap import HeatmapPlot

    fewer_full_collections()  # as the app's process collects
    frames = []
    render = HeatmapPlot.render

    def counted_render(self):
        frames.append(time.perf_counter())
        return render(self)

    HeatmapPlot.render = counted_render

    texts = workload(n_texts, n_tokens)
    app = BatchtuiApp(texts, Settings(model="tiny", dtype="float32", batch_size=4, modules=True, decompose=True))
    latencies = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.state.comparison is None:
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        app.action_rerun()  # a fresh run: the presses below land while its worker computes
        await asyncio.sleep(0.2)
        running_presses = 0
        for i in range(presses):
            before = app.state.selected
            started = time.perf_counter()
            app.simulate_key("l" if i % 2 == 0 else "h")
            while not (app.state.selected != before and frames and frames[-1] > started):
                await asyncio.sleep(0.001)
            latencies.append(frames[-1] - started)
            running_presses += app.state.settled_run != app.state.run_number
            await asyncio.sleep(0.02)
        still_running = running_presses
    return latencies, still_running


async def tab_cpu_seconds(presses: int = 30) -> float:
    """The UI thread's CPU time per Tab press over the explorer's panes, the median of `presses`."""
    from batchtui.core import Settings
    from batchtui.tui.app import BatchtuiApp
    from batchtui.tui.launcher import fewer_full_collections

    fewer_full_collections()
    app = BatchtuiApp(workload(6, 32), Settings(model="tiny"))
    costs = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.state.comparison is None or app.workers:
            await pilot.pause(0.05)
        for _ in range(presses):
            started = time.thread_time()
            await pilot.press("tab")
            costs.append(time.thread_time() - started)
    return statistics.median(costs)


def quit_seconds(key: bytes) -> float:
    """The app in a pseudo-terminal on the tiny model: once its results are on screen, `key` until exit."""
    session = Path(tempfile.mkdtemp()) / "session.json"
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-m", "batchtui.tui", "--session", str(session), "--model", "tiny"])
    screen, deadline = b"", time.monotonic() + 120
    while b"texts diverge" not in screen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            screen += os.read(fd, 65536)
    time.sleep(1.0)  # idle
    started = time.monotonic()
    os.write(fd, key)
    while True:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                os.read(fd, 65536)
            except OSError:  # the terminal closed with the process
                pass
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            os.close(fd)
            return time.monotonic() - started
        if time.monotonic() - started > 30:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=60)
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=270, help="tokens per text")
    args = parser.parse_args()
    frames = [first_frame_seconds(args.texts, args.tokens) for _ in range(3)]
    first = statistics.median(frames)
    latencies, still_running = asyncio.run(key_latencies(args.presses, args.texts, args.tokens))
    latencies.sort()
    p50 = statistics.median(latencies)
    p95 = latencies[max(0, int(round(0.95 * len(latencies))) - 1)]
    print(f"first frame: median {first:.3f} s of 3 starts ({', '.join(f'{f:.3f}' for f in frames)})")
    print(
        f"key latency while comparing: p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms,"
        f" max {latencies[-1] * 1000:.1f} ms"
        f" over {len(latencies)} presses ({still_running} of them while the comparison ran)"
    )
    print(f"tab: {asyncio.run(tab_cpu_seconds()) * 1000:.0f} ms of the UI thread's CPU per press (median of 30)")
    ok_first = first <= FIRST_FRAME_LIMIT_S
    ok_keys = p95 <= KEY_P95_LIMIT_S
    quits = {name: quit_seconds(key) for name, key in (("q", b"q"), ("ctrl+c", b"\x03"))}
    ok_quit = max(quits.values()) <= QUIT_LIMIT_S
    print(f"first_frame {first:.3f} s <= {FIRST_FRAME_LIMIT_S} s: {'PASS' if ok_first else 'FAIL'}")
    print(f"key_p95 {p95 * 1000:.1f} ms <= {KEY_P95_LIMIT_S * 1000:.0f} ms: {'PASS' if ok_keys else 'FAIL'}")
    for name, seconds in quits.items():
        print(f"quit_{name} {seconds:.2f} s <= {QUIT_LIMIT_S} s: {'PASS' if seconds <= QUIT_LIMIT_S else 'FAIL'}")
    return 0 if ok_first and ok_keys and ok_quit else 1


if __name__ == "__main__":
    sys.exit(main())
