"""The command line: one module per command, the options they share, exit codes.
Imports everything below it; nothing imports it but the app's launcher.

The engine's command line: `batchtui SUBCOMMAND` and, without textual, `python -m batchtui.core SUBCOMMAND`."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .exit_codes import EXIT_BAD_INPUT


def _commands() -> dict[str, Callable[[list[str], str], int]]:
    # Imported on use: `batchtui --help` and the app need none of them.
    from .bench import run_bench
    from .check import run_check
    from .diff import run_diff
    from .endpoint import run_endpoint
    from .generate import run_generate
    from .probe import run_probe
    from .rollouts import run_rollouts
    from .sweep import run_sweep

    return {
        "check": run_check,
        "generate": run_generate,
        "sweep": run_sweep,
        "probe": run_probe,
        "bench": run_bench,
        "endpoint": run_endpoint,
        "diff": run_diff,
        "rollouts": run_rollouts,
    }


COMMANDS = ("check", "generate", "sweep", "probe", "bench", "endpoint", "diff", "rollouts")
PROG = "python -m batchtui.core"


def run_command(name: str, argv: list[str], prog: str) -> int:
    return _commands()[name](argv, prog)


def main(argv: list[str] | None = None) -> int:
    """Entry of `python -m core`: subcommands only (the TUI needs textual, which a GPU box may lack)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ",".join(COMMANDS)
        usage = f"usage: {PROG} {{{names}}} [options] (see {PROG} check --help)"
        print(usage, file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_command(argv[0], argv[1:], prog=f"{PROG} {argv[0]}")
