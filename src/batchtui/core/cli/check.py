"""`batchtui check`: a table, a JSON report, and an exit code for CI; `--remedy` measures remedies."""

from __future__ import annotations

import argparse

from .exit_codes import parsed_and_guarded
from .options import add_remedy_option, command_parser
from .parser import OneLineParser, given_options
from .report_command import ReportKind, add_repro_options, report_command
from .shared_options import add_shared

DESCRIPTION = (
    "Compare each text's logits run alone and inside a padded batch. "
    "Exit 0 when every text is allclose, 1 when any diverges, 2 on bad input."
)


def check_parser(prog: str) -> OneLineParser:
    parser = command_parser(prog, DESCRIPTION)
    add_shared(parser, "--json", "--quiet")
    add_remedy_option(parser)
    add_repro_options(parser)
    parser.add_argument(
        "--from", dest="from_pack", metavar="DIR", help="run a repro pack again here and compare its logits bitwise"
    )
    add_shared(parser, "--ops")
    parser.add_argument(
        "--explain",
        choices=("kernels",),
        help="kernels: which of the invariant mode's classes (matmul, reduction, attention, elementwise) the "
        "difference comes from, one at a time and all but one, and the minimal set that makes every text bitwise",
    )
    return parser


def run_check(argv: list[str], prog: str = "batchtui check") -> int:
    parser = check_parser(prog)
    return parsed_and_guarded(parser, argv, lambda args: _check(args, [*prog.split(), *argv], parser, argv))


def _check(args: argparse.Namespace, command_line: list[str], parser: OneLineParser, argv: list[str]) -> int:
    if args.from_pack:
        from .from_pack import check_from_pack

        return check_from_pack(args, given_options(parser, argv))
    if args.explain == "kernels":
        from .kernels import explain_kernels

        return explain_kernels(args)
    args.command_line = command_line

    def run(texts, settings, lines, sink, progress):
        from ..run.comparison_job import ComparisonJob
        from ..texts import NumberedTexts

        return ComparisonJob(NumberedTexts(texts, lines), settings, ops=args.ops).run(progress, logits_sink=sink)

    return report_command(args, run, _check_report)


def _check_report() -> ReportKind:
    from ..reports.report import summary_json, to_json_dict
    from ..terminal.plain import format_localization, format_table, verdict

    def table(comparison) -> str:
        shown = format_table(comparison)
        return f"{shown}\n{format_localization(comparison)}" if comparison.config["modules"] else shown

    return ReportKind(table, verdict, to_json_dict, summary_json, diverged=lambda comparison: not comparison.all_close)
