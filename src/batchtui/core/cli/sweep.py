"""`batchtui sweep`: the comparison (or greedy generation) over a grid of settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from functools import partial

from ..numbers.comparison import RunResult
from ..terminal.plain import GENERATE_SWEEP_HEADER, SWEEP_HEADER, format_columns, sweep_row
from .exit_codes import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK, parsed_and_guarded
from .from_args import settings_from_args, texts_from_args
from .generate import add_generation_options
from .options import command_parser
from .output import check_report_destination, human_output
from .progress import Progress
from .shared_options import add_shared
from .torch_start import start_torch
from .validators import names_argument

DESCRIPTION = (
    "Run the comparison (or, with --generate, greedy generation) over a grid of settings. Exit 0 "
    "when every cell is allclose (every continuation the same), 1 when a cell diverged, 2 on bad input or "
    "when a cell could not run."
)


def run_sweep(argv: list[str], prog: str = "batchtui sweep") -> int:
    parser = command_parser(prog, DESCRIPTION)
    add_shared(parser, "--dtypes", "--batch-sizes", dtypes={"default": ["bfloat16", "float32"]},
               batch_sizes={"default": [1, 2, 4, 8]})  # fmt: skip
    parser.add_argument(
        "--attns", type=names_argument, default=["default"], help="e.g. sdpa,eager (default: the model's)"
    )
    parser.add_argument("--padding-sides", type=names_argument, default=["left", "right"], help="default: left,right")
    add_shared(parser, "--json", "--quiet")
    parser.add_argument(
        "--generate",
        action="store_true",
        help="count continuations that differ per cell (greedy generate, left padding) instead of logits",
    )
    add_generation_options(parser)
    return parsed_and_guarded(parser, argv, _sweep)


def _sweep(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    texts = texts_from_args(args).texts
    check_report_destination(args.json)
    from ..experiments.sweep import describe_cell, sweep, sweep_grid, sweep_summary

    padding_sides = ["left"] if args.generate else args.padding_sides  # generation pads on the left
    grid = sweep_grid(settings, args.dtypes, args.batch_sizes, args.attns, padding_sides)
    for cell in grid:
        cell.validated()
    start_torch(args)
    run_one: Callable[..., RunResult]  # one cell's run
    if args.generate:
        from ..run.generation_run import generate_and_compare

        run_one = partial(generate_and_compare, max_new_tokens=args.max_new_tokens, from_embeds=args.from_embeds)
    else:
        from ..run.engine import compare

        run_one = compare

    bar = Progress(args.quiet)
    cells = sweep(texts, grid, run_one, progress=lambda done, total, cell: bar(done, total, describe_cell(cell)))
    out = human_output(args.json)
    rows = [sweep_row(c) for c in cells]
    header = GENERATE_SWEEP_HEADER if args.generate else SWEEP_HEADER
    print(format_columns(header, rows, left={0, 2, 3, 7}), file=out)
    print(sweep_summary(cells), file=out)
    if args.json:
        from ..reports.report import run_environment, write_json

        report = {"config": settings.as_dict(), "texts": texts, "cells": [asdict(c) for c in cells]}
        report["environment"] = run_environment(settings.as_dict(), texts)
        write_json(report, args.json)
    if any(cell.error for cell in cells):
        return EXIT_BAD_INPUT
    return EXIT_DIVERGED if any(cell.diverged or cell.differ for cell in cells) else EXIT_OK
