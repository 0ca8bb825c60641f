"""The `batchtui` command: subcommands go to the engine's CLI, anything else starts the app."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core import session as session_file
from ..core.cli import COMMANDS, EXIT_BAD_INPUT, run_command
from ..core.cli_options import OneLineParser, add_common_options, settings_from_args, texts_from_args
from ..core.errors import BatchtuiError
from ..core.settings import Settings

# Settings a session restores; the model, device and trust flag always come from the command line.
LIVE_SETTINGS = (
    "dtype",
    "batch_size",
    "padding_side",
    "positions",
    "attn",
    "top_k",
    "atol",
    "rtol",
    "modules",
    "decompose",
    "reference",
)
ARG_OF_SETTING = {"modules": "layers"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:], prog=f"batchtui {argv[0]}")
    return run_app(argv)


def app_parser() -> OneLineParser:
    parser = OneLineParser(prog="batchtui", description="Explore batched-vs-single logit differences live.")
    add_common_options(parser)
    parser.add_argument("--session", metavar="FILE", help="session file (default: under $XDG_STATE_HOME/batchtui)")
    return parser


def run_app(argv: list[str]) -> int:
    app = build_app(argv)
    if isinstance(app, int):
        return app
    app.run()
    return 0


def build_app(argv: list[str]):
    """The app the command line asks for, with the last session restored; or an exit code."""
    parser = app_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        settings = settings_from_args(args)
        given = bool(args.texts or args.texts_file)
        texts = texts_from_args(args)
    except BatchtuiError as exc:
        print(f"batchtui: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    path = Path(args.session) if args.session else session_file.default_session_path()
    notice = None
    if not given:  # no texts on the command line: the last session's come back
        restored = session_file.load(path)
        notice = restored.notice
        if restored.session is not None:
            texts = restored.session.texts
            settings = _restored_settings(parser, args, settings, restored.session.settings)
    from .app import BatchtuiApp

    return BatchtuiApp(texts, settings, session_path=path, startup_notice=notice)


def _restored_settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace, current: Settings, saved: Settings
) -> Settings:
    """The saved live settings, except those given explicitly now; none if the model differs."""
    if saved.model != current.model:
        return current
    changes = {}
    for name in LIVE_SETTINGS:
        arg = ARG_OF_SETTING.get(name, name)
        if getattr(args, arg) == parser.get_default(arg):
            changes[name] = getattr(saved, name)
    return current.with_changes(**changes)
