"""`batchtui sweep` (the comparison over a settings grid) and `batchtui probe` (one Linear layer)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from functools import partial

from .cli import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK, parsed_and_guarded
from .cli_generate import add_generation_options
from .cli_options import (
    OneLineParser,
    ProgressLine,
    add_common_options,
    check_report_destination,
    human_output,
    settings_from_args,
    texts_from_args,
)
from .errors import InputError
from .plain_text import GENERATE_SWEEP_HEADER, SWEEP_HEADER, format_columns, format_float, sweep_row
from .settings import Settings
from .sweep import parse_batch_sizes, parse_names

# Floating-point types a Linear layer computes in; integer types have no matmul to probe.
PROBE_DTYPES = ("bfloat16", "float16", "float32", "float64")


def _as_argument(parse):
    """A core parser as an argparse type: its InputError becomes argparse's own message."""

    def parsed(value: str):
        try:
            return parse(value)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


_names = _as_argument(parse_names)
_ints = _as_argument(parse_batch_sizes)


def run_sweep(argv: list[str], prog: str = "batchtui sweep") -> int:
    parser = OneLineParser(
        prog=prog,
        description="Run the comparison (or, with --generate, greedy generation) over a grid of settings. Exit 0 "
        "when every cell is allclose (every continuation the same), 1 when a cell diverged, 2 on bad input or "
        "when a cell could not run.",
    )
    add_common_options(parser)
    parser.add_argument("--dtypes", type=_names, default=["bfloat16", "float32"], help="default: bfloat16,float32")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4, 8], help="default: 1,2,4,8")
    parser.add_argument("--attns", type=_names, default=["default"], help="e.g. sdpa,eager (default: the model's)")
    parser.add_argument("--padding-sides", type=_names, default=["left", "right"], help="default: left,right")
    parser.add_argument("--json", metavar="PATH", help="write the result matrix to PATH ('-' for stdout)")
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
    from .sweep import describe_cell, sweep, sweep_grid, sweep_summary

    padding_sides = ["left"] if args.generate else args.padding_sides  # generation pads on the left
    grid = sweep_grid(settings, args.dtypes, args.batch_sizes, args.attns, padding_sides)
    for cell in grid:
        cell.validated()
    if args.generate:
        from .generation import generate_and_compare

        compare = partial(generate_and_compare, max_new_tokens=args.max_new_tokens, from_embeds=args.from_embeds)
    else:
        from .engine import compare

    bar = ProgressLine()
    cells = sweep(texts, grid, compare, progress=lambda done, total, cell: bar(done, total, describe_cell(cell)))
    out = human_output(args.json)
    rows = [sweep_row(c) for c in cells]
    header = GENERATE_SWEEP_HEADER if args.generate else SWEEP_HEADER
    print(format_columns(header, rows, left={0, 2, 3, 7}), file=out)
    print(sweep_summary(cells), file=out)
    if args.json:
        from .report import write_json

        write_json({"config": settings.as_dict(), "texts": texts, "cells": [asdict(c) for c in cells]}, args.json)
    if any(cell.error for cell in cells):
        return EXIT_BAD_INPUT
    return EXIT_DIVERGED if any(cell.diverged or cell.differ for cell in cells) else EXIT_OK


def run_probe(argv: list[str], prog: str = "batchtui probe") -> int:
    from .settings import DEFAULT_ATOL, DEFAULT_RTOL

    parser = OneLineParser(prog=prog, description="Row 0 of a batch vs the same row alone, through one Linear layer.")
    parser.add_argument("--sizes", type=_ints, default=[256, 512, 1024, 1536, 2048, 4096], help="layer widths")
    parser.add_argument("--batch-sizes", type=_ints, default=[2, 4, 8, 16, 32, 64], help="rows in the batch")
    parser.add_argument("--dtypes", type=_names, default=["bfloat16", "float16", "float32"], help="dtypes")
    parser.add_argument("--repeats", type=int, default=3, metavar="R", help="fresh seeded inputs per cell")
    parser.add_argument("--device", default="auto", help="cuda, mps, cpu...")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="allclose tolerance")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="allclose tolerance")
    parser.add_argument("--json", metavar="PATH", help="write every cell to PATH ('-' for stdout)")
    return parsed_and_guarded(parser, argv, _probe)


def _probe(args: argparse.Namespace) -> int:
    if args.repeats < 1 or min(args.sizes) < 1 or min(args.batch_sizes) < 2:
        raise InputError("repeats and sizes must be at least 1, batch sizes at least 2")
    unknown = [d for d in args.dtypes if d not in PROBE_DTYPES]
    if unknown:
        raise InputError(f"probe dtypes must be among {', '.join(PROBE_DTYPES)}, not {', '.join(unknown)}")
    Settings(device=args.device, atol=args.atol, rtol=args.rtol).validated()
    check_report_destination(args.json)
    from .models import resolve_device
    from .probe import probe

    device = resolve_device(args.device)
    bar = ProgressLine()
    cells = probe(
        args.sizes,
        args.batch_sizes,
        args.dtypes,
        args.repeats,
        device,
        args.atol,
        args.rtol,
        progress=lambda done, total: bar(done, total, "cells"),
    )
    out = human_output(args.json)
    print(
        f"row 0 of a batch of N vs the same row alone, through one Linear layer on {device}; each N= cell is "
        f"equal/close/runs: of {args.repeats} runs, how many gave bitwise-equal rows and how many allclose ones "
        "(* = two runs of the same inputs differed: not repeatable)",
        file=out,
    )
    for dtype in args.dtypes:
        rows = []
        for size in args.sizes:
            row = [str(size)]
            for n in args.batch_sizes:
                c = next(c for c in cells if (c.dtype, c.size, c.batch_size) == (dtype, size, n))
                row.append(f"{c.bitwise_equal}/{c.allclose}/{c.repeats}{'' if c.repeatable else '*'}")
            worst = max(c.max_abs_diff for c in cells if (c.dtype, c.size) == (dtype, size))
            rows.append((*row, format_float(worst)))
        header = (f"{dtype} size", *(f"N={n} eq/close/runs" for n in args.batch_sizes), "max|Δ|")
        print(format_columns(header, rows), file=out)
    if args.json:
        from .report import write_json

        write_json({"device": device, "cells": [asdict(c) for c in cells]}, args.json)
    return EXIT_OK
