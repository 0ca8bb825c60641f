"""Which of the batch-invariant mode's four parts a machine's difference comes from, and the cheapest set that
removes it.

The texts are compared as configured (the baseline), then with each class of the mode alone, and with all
but each one; the minimal set is the smallest set of classes with which every text's batched logits equal its
single run's, bitwise (singles first, then pairs, then the rest), or None where even the whole mode leaves one.
Its cost is its run's time next to the baseline's, measured in the same process.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..numbers.comparison import Comparison
from ..settings import KERNEL_CLASSES, Settings
from ..terminal.plain import format_float


@dataclass(frozen=True)
class KernelClass:
    name: str
    alone_bitwise_texts: int  # texts whose batched logits equal their single run's with this class alone
    without_bitwise_texts: int  # ... with every class but this one
    max_abs_diff_alone: float  # the largest max|Δ| left with this class alone


@dataclass(frozen=True)
class KernelAttribution:
    texts: int
    baseline_bitwise_texts: int
    classes: tuple[KernelClass, ...]
    minimal: tuple[str, ...] | None  # None: no set of classes makes every text bitwise
    # the minimal set's run time over the baseline's: the median of `COST_ROUNDS` paired timings, and their spread
    minimal_cost_ratio: float | None
    baseline: Comparison
    minimal_cost_spread: tuple[float, float] | None = None


COST_ROUNDS = 3  # paired timings of the minimal set against the baseline


def with_classes(settings: Settings, classes: tuple[str, ...]) -> Settings:
    """`settings` in the invariant mode with these of its parts alone (none: out of the mode)."""
    return settings.with_changes(invariant=bool(classes), invariant_classes=",".join(classes))


def _bitwise(comparison: Comparison) -> int:
    return sum(t.bitwise_equal for t in comparison.texts)


def first_runs() -> set[tuple[str, ...]]:
    """The class sets every attribution runs: none, each class alone, all but each (some are one set)."""
    alone = {(name,) for name in KERNEL_CLASSES}
    all_but = {tuple(c for c in KERNEL_CLASSES if c != name) for name in KERNEL_CLASSES}
    return {(), *alone, *all_but}


def planned_runs() -> int:
    """The comparisons an attribution runs when the minimal set is among `first_runs()` (the usual case): those,
    then the paired timings. A search past them runs more, one comparison per set it tries."""
    return len(first_runs()) + 2 * COST_ROUNDS


def attribute_kernels(
    texts: list[str], settings: Settings, compare_fn: Callable[[list[str], Settings], Comparison]
) -> KernelAttribution:
    """`compare_fn(texts, settings)` runs one comparison (the engine's `compare`, with the caller's progress)."""
    runs: dict[tuple[str, ...], Comparison] = {}

    def run(classes: tuple[str, ...]) -> Comparison:
        if classes not in runs:
            runs[classes] = compare_fn(texts, with_classes(settings, classes))
        return runs[classes]

    baseline = run(())
    found = []
    for name in KERNEL_CLASSES:
        alone, without = run((name,)), run(tuple(c for c in KERNEL_CLASSES if c != name))
        found.append(KernelClass(name, _bitwise(alone), _bitwise(without), alone.max_abs_diff))
    minimal = next(
        (
            classes
            for size in range(len(KERNEL_CLASSES) + 1)
            for classes in itertools.combinations(KERNEL_CLASSES, size)
            if _bitwise(run(classes)) == len(texts)
        ),
        None,
    )
    ratio = spread = None
    if minimal is not None:  # timed afresh, side by side in rounds (as `bench` does): the first runs loaded the model
        ratios = []
        for round_ in range(COST_ROUNDS):
            pair = [settings, with_classes(settings, minimal)]
            order = pair if round_ % 2 == 0 else pair[::-1]  # neither always first
            seconds = {id(s): compare_fn(texts, s).elapsed_s for s in order}
            if seconds[id(pair[0])] > 0:
                ratios.append(seconds[id(pair[1])] / seconds[id(pair[0])])
        if ratios:
            ratio, spread = statistics.median(ratios), (min(ratios), max(ratios))
    return KernelAttribution(len(texts), _bitwise(baseline), tuple(found), minimal, ratio, baseline, spread)


def kernels_table(found: KernelAttribution) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The classes' header and rows, as the CLI and the app show them."""
    total = found.texts
    rows: list[tuple[str, ...]] = [
        (
            c.name,
            f"{c.alone_bitwise_texts}/{total}",
            f"{c.without_bitwise_texts}/{total}",
            format_float(c.max_abs_diff_alone),
        )
        for c in found.classes
    ]
    return ("class", "alone: bitwise", "all but it: bitwise", "max|Δ| alone"), rows


def kernels_verdict(found: KernelAttribution) -> str:
    line = f"as configured: {found.baseline_bitwise_texts}/{found.texts} texts bitwise; "
    if found.minimal is None:
        return line + "no set of the mode's classes makes every text bitwise (the mode's own check says where it parts)"
    if not found.minimal:
        return line + "no class is needed"
    cost = ""
    if found.minimal_cost_ratio is not None:
        low, high = found.minimal_cost_spread or (found.minimal_cost_ratio,) * 2
        cost = (
            f", at about {found.minimal_cost_ratio:.2f}x the time (the median of {COST_ROUNDS} paired timings, "
            f"{low:.2f}-{high:.2f}; `batchtui bench` measures it with care)"
        )
    return line + f"the minimal set {'+'.join(found.minimal)} makes all {found.texts} bitwise{cost}"


def code_line(classes: tuple[str, ...] | None) -> str:
    """The line to put in one's own code for the mode (`classes`: only these of its parts; None: all)."""
    chosen = "" if classes is None else f", classes={tuple(classes)!r}"
    return f"in your code: from batchtui.core import batch_invariant; with batch_invariant(model{chosen}): ..."


def kernels_json(found: KernelAttribution) -> dict:
    from ..reports.report import number

    return {
        "texts": found.texts,
        "baseline_bitwise_texts": found.baseline_bitwise_texts,
        "classes": [
            {
                "name": c.name,
                "alone_bitwise_texts": c.alone_bitwise_texts,
                "without_bitwise_texts": c.without_bitwise_texts,
                "max_abs_diff_alone": number(c.max_abs_diff_alone),
            }
            for c in found.classes
        ],
        "minimal": None if found.minimal is None else list(found.minimal),
        "minimal_cost_ratio": None if found.minimal_cost_ratio is None else number(found.minimal_cost_ratio),
        "minimal_cost_spread": None if found.minimal_cost_spread is None else list(found.minimal_cost_spread),
    }
