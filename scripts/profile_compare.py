"""Where a comparison's time goes beyond its forward passes, stage by stage, on the CPU or a GPU.

    python scripts/profile_compare.py [--model tiny-qwen2.5-1.5b-shape] [--dtype bfloat16] [--invariant]

Runs from the repository root (as `PYTHONPATH=src python -m batchtui.core` does on a box without textual) on `bench`'s
workload (16 texts of 32..128 tokens, batch size 8). Prints the floor (the bare passes), the same passes recording the
hidden states (what the hooks cost) and compare, best of interleaved rounds; then, for one more comparison under the
profiler, each stage's calls, milliseconds (the device synchronized around it; the profiler slows every op) and what it
asked of the device: kernel launches and waits for the device (a GPU; the timer's own waits not counted), or the torch
ops it called (the CPU); a pass's count holds its hooks'. On a GPU a model of this size leaves the device idle while the
host launches kernels, so launches and waits, not arithmetic, are what a stage costs there; the lines of code that wait
follow, counted over one comparison (torch's sync debug mode), with the bare passes' count beside. Last, the peak memory
of each (as `bench` measures it: the device's allocator, or the CPU's resident set).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # the checkout's `batchtui.core`

from batchtui.core.bench.clock import peak_memory  # noqa: E402
from batchtui.core.bench.methods import floor_passes, workload  # noqa: E402
from batchtui.core.models.loading import load_model  # noqa: E402
from batchtui.core.numbers.cpu_memory import keep_freed_memory  # noqa: E402
from batchtui.core.run import assemble, engine  # noqa: E402
from batchtui.core.run.runner import Runner  # noqa: E402
from batchtui.core.run.skeleton import chunks  # noqa: E402
from batchtui.core.settings import Settings  # noqa: E402

STAGES = (  # (owner, attribute): what a comparison does besides its passes, and the passes themselves
    (Runner, "batched"),
    (Runner, "single"),
    (engine, "group_rows"),
    (assemble, "position_stats"),
    (assemble, "layer_stats"),
    (engine, "group_results"),
)
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx")
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2.5-1.5b-shape")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--invariant", action="store_true", help="compare in the batch-invariant mode (not the floor)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    keep_freed_memory()
    settings = Settings(model=args.model, dtype=args.dtype, invariant=args.invariant)
    loaded = load_model(settings)
    texts = workload(loaded.tokenizer, 16, 32, 128)
    cuda = loaded.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    methods = {
        "floor": lambda: floor_passes(loaded, texts, settings),
        "recorded": lambda: recorded_passes(loaded, texts, settings),
        "compare": lambda: engine.compare(texts, settings),
    }
    best = best_of(methods, args.rounds, sync)
    mode = " (invariant)" if args.invariant else ""
    floor, recorded, compare = (1e3 * best[name] for name in methods)
    print(
        f"{args.model} {loaded.dtype} on {loaded.device}{mode}: floor {floor:.1f} ms, recorded passes {recorded:.1f} "
        f"ms ({recorded / floor:.3f}), compare {compare:.1f} ms, ratio {compare / floor:.3f}"
    )

    spent: dict[str, list[float]] = {name: [] for _, name in STAGES}
    for owner, name in STAGES:
        setattr(owner, name, _timed(getattr(owner, name), name, spent[name], sync))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        methods["compare"]()
        sync()
    print(f"{'stage':16} {'calls':>6} {'ms':>8} {'launches' if cuda else 'torch ops':>10} {'waits' if cuda else '':>6}")
    for _, name in STAGES:
        asked, waits = _asked(prof, name, cuda)
        print(f"{name:16} {len(spent[name]):6d} {1e3 * sum(spent[name]):8.1f} {asked:10d} {waits if cuda else '':>6}")
    if cuda:
        for owner, name in STAGES:
            setattr(owner, name, getattr(owner, name).__wrapped__)
        waiting, floor_waits = (waits_by_line(methods[name]) for name in ("compare", "floor"))
        print(f"waits for the device: compare {sum(waiting.values())}, floor {sum(floor_waits.values())}")
        for where, count in waiting.most_common(20):
            print(f"{count:6d}  {where}")
    floor, compare = (peak_memory(methods[name], loaded.device) / 2**20 for name in ("floor", "compare"))
    print(f"peak memory above the weights: floor {floor:.0f} MiB, compare {compare:.0f} MiB")


def best_of(methods: dict, rounds: int, sync) -> dict[str, float]:
    """Each method's best time in seconds over `rounds` rounds after a warm-up, the order rotating each round."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for round_ in range(rounds + 1):  # the first is a warm-up
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            sync()
            started = time.perf_counter()
            methods[name]()
            sync()
            if round_:
                times[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in times.items()}


def recorded_passes(loaded, texts: list[str], settings: Settings) -> None:
    """The floor's passes with the hidden states recorded as a comparison records them, and nothing measured."""
    runner = Runner(loaded, settings.padding_side, settings.positions, modules=settings.modules)
    with runner, torch.inference_mode():
        for chunk in chunks(texts, list(range(1, len(texts) + 1)), settings.batch_size):
            del runner.batched(chunk.texts).output
        for text in texts:
            runner.single(runner.tokenize(text)[0])


def waits_by_line(method) -> Counter:
    """How often `method` waits for the device, by the repository's innermost lines that asked (three, innermost
    first), as torch's sync debug mode reports each wait (a copy to or from the host, `.item()`, `nonzero`...)."""
    root = str(Path(__file__).resolve().parent.parent)
    counted: Counter = Counter()

    def count(*_):
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(root)]
        counted[" < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:][::-1])] += 1

    with warnings.catch_warnings():  # which puts showwarning back too
        warnings.simplefilter("always")
        warnings.showwarning = count
        torch.cuda.set_sync_debug_mode("warn")
        try:
            method()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return counted


def _timed(fn, name: str, spent: list[float], sync):
    def timed(*args, **kwargs):
        sync()
        started = time.perf_counter()
        with record_function(f"stage:{name}"):
            result = fn(*args, **kwargs)
        sync()  # outside the range: the stage's waits are its own
        spent.append(time.perf_counter() - started)
        return result

    timed.__wrapped__ = fn
    return timed


def _asked(prof, name: str, cuda: bool) -> tuple[int, int]:
    """(launches, waits) on a GPU, (torch ops, 0) on the CPU, under every range of the stage."""

    def walk(event) -> tuple[int, int]:
        launches = waits = 0
        if cuda:
            launches, waits = int(event.name in LAUNCHES), int(event.name in WAITS)
        elif event.name.startswith("aten::") and (
            event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")
        ):
            launches = 1  # an op the stage called, not one inside another op
        for child in event.cpu_children:
            more = walk(child)
            launches, waits = launches + more[0], waits + more[1]
        return launches, waits

    totals = [0, 0]
    for event in prof.events():
        if event.name == f"stage:{name}":
            launches, waits = walk(event)
            totals[0] += launches
            totals[1] += waits
    return totals[0], totals[1]


if __name__ == "__main__":
    main()
