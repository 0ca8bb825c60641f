"""`batchtui check --explain kernels`: which of the batch-invariant mode's parts this machine's difference comes
from, and the cheapest set of them that makes every text bitwise (`kernel_classes`)."""

from __future__ import annotations

import argparse

from .cli_exit import EXIT_DIVERGED, EXIT_OK
from .cli_options import (
    ProgressLine,
    check_report_destination,
    human_output,
    settings_from_args,
    start_torch,
    texts_from_args,
)
from .plain_text import format_columns, format_float


def explain_kernels(args: argparse.Namespace) -> int:
    settings = settings_from_args(args).with_changes(invariant=False, invariant_classes="")
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    start_torch(args)
    from .engine import compare
    from .kernel_classes import attribute_kernels
    from .report import number, run_environment, write_json

    bar = ProgressLine()
    runs = [0]

    def compare_fn(texts, run_settings):
        runs[0] += 1
        return compare(texts, run_settings, lines=numbered.lines, progress=lambda d, t: bar(d, t, f"run {runs[0]}"))

    found = attribute_kernels(numbered.texts, settings, compare_fn)
    out = human_output(args.json)
    total = found.texts
    rows = [
        (
            c.name,
            f"{c.alone_bitwise_texts}/{total}",
            f"{c.without_bitwise_texts}/{total}",
            format_float(c.max_abs_diff_alone),
        )
        for c in found.classes
    ]
    print(format_columns(("class", "alone: bitwise", "all but it: bitwise", "max|Δ| alone"), rows, left={0}), file=out)
    print(kernels_verdict(found), file=out)
    if args.json:
        write_json(
            {
                "config": found.baseline.config,
                "kernels": {
                    "texts": total,
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
                    "minimal_cost_ratio": None
                    if found.minimal_cost_ratio is None
                    else number(found.minimal_cost_ratio),
                },
                "environment": run_environment(found.baseline.config, numbered.texts),
            },
            args.json,
        )
    return EXIT_OK if found.baseline.all_close else EXIT_DIVERGED


def _ratio(value: float | None) -> float | None:
    from .report import number

    return None if value is None else number(value)


def kernels_verdict(found) -> str:
    line = f"as configured: {found.baseline_bitwise_texts}/{found.texts} texts bitwise; "
    if found.minimal is None:
        return line + "no set of the mode's classes makes every text bitwise (the mode's own check says where it parts)"
    if not found.minimal:
        return line + "no class is needed"
    cost = "" if found.minimal_cost_ratio is None else f", at {found.minimal_cost_ratio:.2f}x the time"
    return line + f"the minimal set {'+'.join(found.minimal)} makes all {found.texts} bitwise{cost}"
