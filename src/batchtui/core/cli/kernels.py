"""`batchtui check --explain kernels`: which of the batch-invariant mode's parts this machine's difference comes
from, and the cheapest set of them that makes every text bitwise (`kernel_classes`)."""

from __future__ import annotations

import argparse

from ..terminal.plain import format_columns
from .exit_codes import EXIT_DIVERGED, EXIT_OK
from .from_args import settings_from_args, texts_from_args
from .output import check_report_destination, human_output
from .progress import Progress
from .torch_start import start_torch


def explain_kernels(args: argparse.Namespace) -> int:
    settings = settings_from_args(args).with_changes(invariant=False, invariant_classes="")
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    start_torch(args)
    from ..experiments.kernel_classes import (
        attribute_kernels,
        code_line,
        kernels_json,
        kernels_table,
        kernels_verdict,
        planned_runs,
    )
    from ..reports.report import run_environment, write_json
    from ..run.engine import compare

    bar = Progress(args.quiet)
    runs, planned = [0], [planned_runs()]

    def compare_fn(texts, run_settings):
        # one bar over every run, counted in passes (each run makes the same ones): it never starts again at 0
        runs[0] += 1
        planned[0] = max(planned[0], runs[0])  # (a search past the first runs adds its own)

        def progress(done: int, total: int) -> None:
            bar((runs[0] - 1) * total + done, planned[0] * total, f"run {runs[0]} of {planned[0]}")

        return compare(texts, run_settings, lines=numbered.lines, progress=progress)

    found = attribute_kernels(numbered.texts, settings, compare_fn)
    out = human_output(args.json)
    print(format_columns(*kernels_table(found), left={0}), file=out)
    print(kernels_verdict(found), file=out)
    if found.minimal:
        print(code_line(found.minimal), file=out)
    if args.json:
        environment = run_environment(found.baseline.config, numbered.texts)
        write_json(
            {"config": found.baseline.config, "kernels": kernels_json(found), "environment": environment}, args.json
        )
    return EXIT_OK if found.baseline.all_close else EXIT_DIVERGED
