"""The `batchtui` command: subcommands go to the engine's CLI, anything else starts the app."""

from __future__ import annotations

import sys

from core.cli import COMMANDS, EXIT_BAD_INPUT, run_command
from core.cli_options import OneLineParser, add_common_options, settings_from_args, texts_from_args
from core.errors import BatchtuiError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:], prog=f"batchtui {argv[0]}")
    return run_app(argv)


def run_app(argv: list[str]) -> int:
    parser = OneLineParser(prog="batchtui", description="Explore batched-vs-single logit differences live.")
    add_common_options(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        settings = settings_from_args(args)
        texts = texts_from_args(args)
    except BatchtuiError as exc:
        print(f"batchtui: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from tui.app import BatchtuiApp

    BatchtuiApp(texts, settings).run()
    return 0
