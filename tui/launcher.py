"""The `batchtui` command: subcommands go to the engine's CLI, anything else starts the app."""

from __future__ import annotations

import sys

from core.cli import COMMANDS, run_check


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return run_check(argv[1:])
    from tui.app import run_app

    return run_app(argv)
