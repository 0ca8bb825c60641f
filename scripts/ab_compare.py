"""A comparison's cost beside another revision's, in one process: is a change to the metrics faster?

    python scripts/ab_compare.py REV [--model qwen2-english-4m] [--dtype auto] [--rounds 40] [--invariant]

Runs from the repository root. REV's engine (`git archive` of src/batchtui/core, or of core/ before src/) is loaded
beside the working tree's as a package of its own, both on `bench`'s workload (16 texts of 32..128 tokens, batch size
8), and the floor (the bare passes), REV's comparison and this one are run in turn, the order rotating each round. On a
box whose speed drifts from minute to minute a change of a millisecond or two is lost between two runs of `bench`; side
by side it is not. Printed: each method's best, tenth percentile and median; the same for the time spent measuring
(`group_rows`, `group_stats`, `group_results`: everything a comparison adds to its passes but its hooks and the loop);
and the median of each round's difference, this minus REV. Reports are not compared here: `check --json` on both says
whether they are the same. With `--invariant` both comparisons run in the batch-invariant mode (the floor stays bare): a
change to the mode side by side with REV's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the checkout's `batchtui.core`, installed or not

from batchtui.core.bench.methods import floor_passes, workload  # noqa: E402
from batchtui.core.models.loading import load_model  # noqa: E402
from batchtui.core.numbers.cpu_memory import keep_freed_memory  # noqa: E402
from batchtui.core.run import engine  # noqa: E402
from batchtui.core.settings import Settings  # noqa: E402

MEASURING = ("group_rows", "group_stats", "group_results")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the revision to compare with (a commit, a tag, HEAD~3)")
    parser.add_argument("--model", default="qwen2-english-4m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--invariant", action="store_true", help="both comparisons in the batch-invariant mode")
    args = parser.parse_args()
    keep_freed_memory()
    with tempfile.TemporaryDirectory() as folder:
        other = _core_of(args.rev, Path(folder))
        settings = Settings(model=args.model, dtype=args.dtype)
        other_settings = sys.modules["other_core.settings"].Settings(
            model=args.model, dtype=args.dtype, invariant=args.invariant
        )
        loaded = load_model(settings)
        texts = workload(loaded.tokenizer, 16, 32, 128)
        runs = {
            "floor": (None, lambda: floor_passes(loaded, texts, settings)),
            args.rev: (other, lambda: other.compare(texts, other_settings)),
            "this": (engine, lambda: engine.compare(texts, settings.with_changes(invariant=args.invariant))),
        }
        measuring = {name: _timed_stages(module) for name, (module, _) in runs.items() if module is not None}
        times = {name: [] for name in runs}
        spent = {name: [] for name in measuring}
        for round_ in range(args.rounds + 1):  # the first is a warm-up
            order = list(runs)[round_ % 3 :] + list(runs)[: round_ % 3]
            for name in order:
                if name in measuring:
                    measuring[name][0] = 0.0
                started = time.perf_counter()
                runs[name][1]()
                if round_:
                    times[name].append(1e3 * (time.perf_counter() - started))
                    if name in measuring:
                        spent[name].append(1e3 * measuring[name][0])
    print(f"{args.model}, {args.rounds} rounds (ms): best, tenth percentile, median")
    for title, table in (("whole", times), ("measuring", spent)):
        for name, values in table.items():
            print(f"{title:9} {name:12} {_summary(values)}")
        differences = [new - old for new, old in zip(table["this"], table[args.rev], strict=True)]
        print(f"{title:9} this - {args.rev}: median of the rounds' differences {statistics.median(differences):+.2f}")


def _core_of(rev: str, folder: Path):
    """REV's engine module, its core imported under a name of its own (`other_core`): `run/engine.py`, or
    `engine.py` in revisions before core/ had packages."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "src/batchtui/core"],
        text=True,
        check=True,
        capture_output=True,
    )
    where = "src/batchtui/core" if listed.stdout.strip() else "core"  # core/ at the root before src/
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, where], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    spec = importlib.util.spec_from_file_location(
        "other_core", folder / where / "__init__.py", submodule_search_locations=[str(folder / where)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["other_core"] = package
    spec.loader.exec_module(package)
    importlib.import_module("other_core.settings")
    try:
        return importlib.import_module("other_core.run.engine")
    except ModuleNotFoundError:
        return importlib.import_module("other_core.engine")


def _timed_stages(module) -> list[float]:
    """Wrap the engine module's measuring stages: the returned one-item list adds up their seconds."""
    total = [0.0]
    for name in MEASURING:
        stage = getattr(module, name)

        def timed(*args, _stage=stage, **kwargs):
            started = time.perf_counter()
            result = _stage(*args, **kwargs)
            total[0] += time.perf_counter() - started
            return result

        setattr(module, name, timed)
    return total


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:8.2f} {ordered[len(ordered) // 10]:8.2f} {statistics.median(ordered):8.2f}"


if __name__ == "__main__":
    main()
