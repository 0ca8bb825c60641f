"""`batchtui check`: a table, a JSON report, and an exit code for CI; `--remedy` measures remedies."""

from __future__ import annotations

import argparse
from functools import partial

from .cli_exit import EXIT_DIVERGED, EXIT_OK, parsed_and_guarded
from .cli_options import (
    OneLineParser,
    add_common_options,
    add_remedy_option,
    check_report_destination,
    finish_report,
    human_output,
    measured,
    settings_from_args,
    texts_from_args,
)


def check_parser(prog: str) -> OneLineParser:
    parser = OneLineParser(
        prog=prog,
        description="Compare each text's logits run alone and inside a padded batch. "
        "Exit 0 when every text is allclose, 1 when any diverges, 2 on bad input.",
    )
    add_common_options(parser)
    parser.add_argument("--json", metavar="PATH", help="write the full report to PATH ('-' for stdout)")
    add_remedy_option(parser)
    return parser


def run_check(argv: list[str], prog: str = "batchtui check") -> int:
    return parsed_and_guarded(check_parser(prog), argv, _check)


def _check(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    from .engine import compare  # torch loads only once the arguments are known good
    from .plain_text import format_localization, format_table, verdict
    from .report import summary_json, to_json_dict

    comparison, outcomes = measured(numbered.texts, settings, args.remedy, partial(compare, lines=numbered.lines))
    out = human_output(args.json)
    print(format_table(comparison), file=out)
    if settings.modules:
        print(format_localization(comparison), file=out)
    for note in comparison.notes:
        print(f"note: {note}", file=out)
    print(verdict(comparison), file=out)
    followed = finish_report(comparison, outcomes, settings, args.json, to_json_dict, summary_json)
    return EXIT_OK if followed.all_close else EXIT_DIVERGED
