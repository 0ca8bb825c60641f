"""What the batch-invariant mode costs a comparison, paired round by round in one process.

    python scripts/invariant_cost.py [--model tiny] [--dtype float32] [--rounds 40] [--root CHECKOUT]

Measures the engine of this repository, or of another checkout (`git worktree add /tmp/old REV`, then `--root
/tmp/old`: an earlier revision side by side, one process each). `compare()` of `bench`'s workload (16 texts of
32..128 tokens, batch size 8) is timed out of the mode and in it, in turn, the order swapped every round; printed: the
median of the rounds' ratios (in / out) with its quartiles, and the median of their differences. On a box whose speed
drifts by a fifth from minute to minute, `bench`'s eight rounds put `invariant_vs_compare` anywhere within a few
percent of its value; forty pairs side by side do not.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="a checkout")
    args = parser.parse_args()
    # Its engine, from src/ (`batchtui.core`), or the root's `core` in a checkout from before src/.
    source = args.root / "src"
    sys.path.insert(0, str(source if source.is_dir() else args.root))
    package = "batchtui.core" if source.is_dir() else "core"
    workload = importlib.import_module(f"{package}.bench.methods").workload
    load_model = importlib.import_module(f"{package}.models.loading").load_model
    keep_freed_memory = importlib.import_module(f"{package}.numbers.cpu_memory").keep_freed_memory
    compare = importlib.import_module(f"{package}.run.engine").compare
    Settings = importlib.import_module(f"{package}.settings").Settings

    keep_freed_memory()
    settings = Settings(model=args.model, dtype=args.dtype)
    texts = workload(load_model(settings).tokenizer, 16, 32, 128)
    runs = {"out": settings, "in": settings.with_changes(invariant=True)}

    def timed(name: str) -> float:
        started = time.perf_counter()
        compare(texts, runs[name])
        return time.perf_counter() - started

    for name in runs:  # warm-up: the probe, the census, each path's measurement
        timed(name)
    ratios, differences = [], []
    for round_ in range(args.rounds):
        seconds = {name: timed(name) for name in (runs if round_ % 2 == 0 else reversed(runs))}
        ratios.append(seconds["in"] / seconds["out"])
        differences.append(1e3 * (seconds["in"] - seconds["out"]))
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"{args.root.name} {args.model} {args.dtype}, {args.rounds} rounds: in the mode / out of it "
        f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}, {quartiles[2]:.3f}), "
        f"{statistics.median(differences):+.1f} ms a comparison"
    )


if __name__ == "__main__":
    main()
