"""The command line: one module per command, the options they share, exit codes.
Imports everything below it; nothing imports it but the app's launcher.

The engine's command line: `batchtui SUBCOMMAND` and, without textual, `python -m batchtui.core SUBCOMMAND`."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from .exit_codes import EXIT_BAD_INPUT


@dataclass(frozen=True)
class Command:
    name: str  # `batchtui NAME`; its module here runs it with `run_NAME(argv, prog)`
    summary: str  # what it answers, in a few words (the launcher's --help lists them)


# The one table of commands: the parsers, the launcher's list and its mistyped-command hint read it.
COMMAND_TABLE = (
    Command("check", "table, JSON, exit code for CI"),
    Command("generate", "does batching change the greedy continuation, and from which token"),
    Command("sweep", "a grid of settings"),
    Command("probe", "one Linear layer"),
    Command("bench", "cost against the bare passes"),
    Command("endpoint", "does load change a served model's answer"),
    Command("diff", "two reports or repro packs"),
    Command("rollouts", "a sampler's rollouts scored as a trainer does"),
)
COMMANDS = tuple(command.name for command in COMMAND_TABLE)
PROG = "python -m batchtui.core"


def run_command(name: str, argv: list[str], prog: str) -> int:
    # imported on use: `batchtui --help` and the app need none of the commands
    runner = getattr(importlib.import_module(f".{name}", __name__), f"run_{name}")
    return runner(argv, prog)


def commands_epilog(prog: str) -> str:
    """The commands in a line each's words long, for a --help's end."""
    listed = " · ".join(f"{prog} {command.name} ({command.summary})" for command in COMMAND_TABLE)
    return f"subcommands: {listed}; each has its own --help"


def main(argv: list[str] | None = None) -> int:
    """Entry of `python -m batchtui.core`: subcommands only (the TUI needs textual, which a GPU box may lack)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ",".join(COMMANDS)
        usage = f"usage: {PROG} {{{names}}} [options] (see {PROG} check --help)"
        print(usage, file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_command(argv[0], argv[1:], prog=f"{PROG} {argv[0]}")
