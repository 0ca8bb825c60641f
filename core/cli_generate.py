"""`batchtui generate`: does batching change the greedy continuation of each text, and from which token?"""

from __future__ import annotations

import argparse

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
from .generation_result import DEFAULT_MAX_NEW_TOKENS


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        metavar="N",
        help=f"greedy tokens generated per text, both runs (default: {DEFAULT_MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--from-embeds", action="store_true", help="generate from inputs_embeds (the original report's path)"
    )


def run_generate(argv: list[str], prog: str = "batchtui generate") -> int:
    parser = OneLineParser(
        prog=prog,
        description="Greedy-decode each text alone and inside its left-padded batch with transformers' generate "
        "and report the first step where the continuations part. Exit 0 when every continuation is the same, "
        "1 when any differs, 2 on bad input.",
    )
    add_common_options(parser)
    add_generation_options(parser)
    parser.add_argument("--json", metavar="PATH", help="write the full report to PATH ('-' for stdout)")
    add_remedy_option(parser)
    return parsed_and_guarded(parser, argv, _generate)


def _generate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    from .generation import generate_and_compare  # torch loads only once the arguments are known good
    from .generation_report import (
        format_generation_table,
        generation_json,
        generation_summary_json,
        generation_verdict,
    )

    def generate(texts, run_settings):
        return generate_and_compare(texts, run_settings, args.max_new_tokens, args.from_embeds, lines=numbered.lines)

    comparison, outcomes = measured(numbered.texts, settings, args.remedy, generate)
    out = human_output(args.json)
    print(format_generation_table(comparison), file=out)
    for note in comparison.notes:
        print(f"note: {note}", file=out)
    print(generation_verdict(comparison), file=out)
    followed = finish_report(comparison, outcomes, settings, args.json, generation_json, generation_summary_json)
    return EXIT_DIVERGED if followed.summary.differ else EXIT_OK
