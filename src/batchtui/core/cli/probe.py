"""`batchtui probe`: row 0 of a batch vs the same row alone, through one Linear layer."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ..errors import InputError
from ..settings import FLOAT_DTYPES, LOW_PRECISION_GRID, Settings
from ..terminal.plain import format_columns, format_float
from .exit_codes import EXIT_OK, parsed_and_guarded
from .output import check_report_destination, human_output
from .parser import OneLineParser
from .progress import Progress
from .shared_options import add_shared
from .validators import ints_argument


def run_probe(argv: list[str], prog: str = "batchtui probe") -> int:
    parser = OneLineParser(prog=prog, description="Row 0 of a batch vs the same row alone, through one Linear layer.")
    parser.add_argument("--sizes", type=ints_argument, default=[256, 512, 1024, 1536, 2048, 4096], help="layer widths")
    add_shared(parser, "--batch-sizes", "--dtypes", batch_sizes={"default": [2, 4, 8, 16, 32, 64]},
               dtypes={"default": list(LOW_PRECISION_GRID)})  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, metavar="R", help="fresh seeded inputs per cell")
    add_shared(parser, "--device", "--atol", "--rtol")
    add_shared(parser, "--json", "--quiet")
    return parsed_and_guarded(parser, argv, _probe)


def _probe(args: argparse.Namespace) -> int:
    if args.repeats < 1 or min(args.sizes) < 1 or min(args.batch_sizes) < 2:
        raise InputError("repeats and sizes must be at least 1, batch sizes at least 2")
    unknown = [d for d in args.dtypes if d not in FLOAT_DTYPES]
    if unknown:
        raise InputError(f"probe dtypes must be among {', '.join(FLOAT_DTYPES)}, not {', '.join(unknown)}")
    Settings(device=args.device, atol=args.atol, rtol=args.rtol).validated()
    check_report_destination(args.json)
    from ..experiments.probe import probe
    from ..models.loading import resolve_device

    device = resolve_device(args.device)
    bar = Progress(args.quiet)
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
        from ..reports.environment import environment
        from ..reports.report import write_json

        write_json(
            {"device": device, "cells": [asdict(c) for c in cells], "environment": environment(None, [])}, args.json
        )
    return EXIT_OK
