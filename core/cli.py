"""`batchtui check` (and `python -m core check`): a table, a JSON report, and an exit code for CI."""

from __future__ import annotations

import json
import sys

from core.cli_options import OneLineParser, add_common_options, settings_from_args, texts_from_args
from core.errors import BatchtuiError

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
COMMANDS = ("check",)


def check_parser(prog: str = "batchtui check") -> OneLineParser:
    parser = OneLineParser(
        prog=prog,
        description="Compare each text's logits run alone and inside a padded batch. "
        "Exit 0 when every text is allclose, 1 when any diverges, 2 on bad input.",
    )
    add_common_options(parser)
    parser.add_argument("--json", metavar="PATH", help="write the full report to PATH ('-' for stdout)")
    return parser


def run_check(argv: list[str], prog: str = "batchtui check") -> int:
    try:
        args = check_parser(prog).parse_args(argv)
    except SystemExit as exit_:  # --help or a usage error, already printed as one line
        return int(exit_.code or 0)
    try:
        settings = settings_from_args(args)
        texts = texts_from_args(args)
        from core.engine import compare  # torch loads only once the arguments are known good

        comparison = compare(texts, settings)
        if args.json:
            from core.report import to_json_dict, write_json

            if args.json == "-":
                json.dump(to_json_dict(comparison), sys.stdout, ensure_ascii=False, indent=1)
                sys.stdout.write("\n")
            else:
                write_json(comparison, args.json)
    except BatchtuiError as exc:
        print(f"batchtui: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the user gets one line, never a traceback
        print(f"batchtui: internal error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return EXIT_INTERNAL
    from core.plain_text import format_localization, format_table, verdict

    # With the report on stdout, the human-readable part goes to stderr so the JSON stays parseable.
    out = sys.stderr if args.json == "-" else sys.stdout
    print(format_table(comparison), file=out)
    if settings.modules:
        print(format_localization(comparison), file=out)
    for note in comparison.notes:
        print(f"note: {note}", file=out)
    print(verdict(comparison), file=out)
    return EXIT_OK if comparison.all_close else EXIT_DIVERGED


def main(argv: list[str] | None = None) -> int:
    """Entry of `python -m core`: subcommands only (the TUI needs textual, which a GPU box may lack)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(
            f"usage: python -m core {{{','.join(COMMANDS)}}} [options] (see python -m core check --help)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return run_check(argv[1:], prog=f"python -m core {argv[0]}")
