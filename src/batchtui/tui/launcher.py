"""The `batchtui` command: subcommands go to the engine's CLI, anything else starts the app."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

from ..core.cache_folder import cache_notice
from ..core.cli import COMMANDS, commands_epilog, run_command
from ..core.cli.exit_codes import EXIT_BAD_INPUT, error_line
from ..core.cli.file_roles import check_files_apart
from ..core.cli.from_args import settings_from_args, texts_from_args
from ..core.cli.options import add_common_options
from ..core.cli.parser import OneLineParser, given_options
from ..core.cli.shared_options import add_shared
from ..core.errors import BatchtuiError
from ..core.reports import session as session_file
from ..core.safe_files import check_output_dir
from ..core.settings import Settings, option_dest, restored_settings
from ..core.visible import literal

# A full garbage collection walks every object the process holds (torch's and transformers' modules, Textual's
# caches of rendered lines: ~600k objects) and holds the UI for ~0.25 s; at Python's default (every 10th
# collection of the middle generation) one came every ~15 key presses.
FULL_COLLECTION_EVERY = 100


def fewer_full_collections() -> None:
    """Full collections a tenth as often in the app's process; the young generations as they were."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:], prog=f"batchtui {argv[0]}")
    mistyped = _mistyped_command(argv[0]) if argv else None
    if mistyped is not None:
        print(
            f"batchtui: error: no command {literal(argv[0])!r}: did you mean `batchtui {mistyped}`? (to open the app "
            f"on that text, put it after --: batchtui -- {literal(argv[0])})",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return run_app(argv)


def _mistyped_command(word: str) -> str | None:
    """The command `word` is a slip of (`chek`: check), where it is one word that close to one; else None."""
    import difflib

    if not word.isalpha() or not word.islower():
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.75)
    return close[0] if close else None


def app_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="batchtui",
        description="Explore batched-vs-single logit differences live. Without a subcommand it starts the app.",
        epilog=commands_epilog("batchtui"),
    )
    add_common_options(parser)
    parser.add_argument("--session", metavar="FILE", help="session file (default: under $XDG_STATE_HOME/batchtui)")
    add_shared(parser, "--url", "--api-key-env")
    parser.add_argument(
        "--output-dir", metavar="DIR", help="where ctrl+s reports and f8 screenshots go (default: the current folder)"
    )
    parser.add_argument(
        "--rollouts",
        metavar="FILE.jsonl",
        help="the rollouts view: score a sampler's rollouts with --model as a trainer does (see batchtui rollouts)",
    )
    add_shared(parser, "--batch-tokens")  # (with --rollouts)
    return parser


def run_app(argv: list[str]) -> int:
    """The app: an exit code when it cannot start; once it has run, the process ends here."""
    has_terminal = sys.stdin.isatty() and sys.stdout.isatty()
    app = build_app(argv, set_aside=has_terminal)  # (a damaged session is set aside only for an app that starts)
    if isinstance(app, int):
        return app
    lock = session_file.SessionLock(app.session_path) if app.session_path is not None else None
    try:
        if lock is not None:
            lock.acquire()
    except BatchtuiError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if not has_terminal:
        # Without a terminal the app has no keys to read and would wait on them at full speed.
        if lock is not None:
            lock.release()
        print(
            "batchtui: error: the app needs a terminal (stdin and stdout); for scripts and CI use "
            "`batchtui check` (see batchtui --help)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    fewer_full_collections()
    try:
        app.run()
    finally:
        if lock is not None:
            lock.release()
    # The session is saved and the terminal restored: leave now. The interpreter's teardown (torch's and
    # transformers' modules, a pass abandoned on quit still running) takes over a second and saves nothing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(app.return_code or 0)


def build_app(argv: list[str], set_aside: bool = True):
    """The app the command line asks for, with the last session restored; or an exit code.

    Everything is checked here, before the first frame: a bad value or a session path that is not ours
    to write ends with one line and exit code 2, with nothing written; a damaged session of ours is set aside
    only with `set_aside`.
    """
    parser = app_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        check_files_apart(args)  # (the session is written over and over: never over a file the app reads)
    except BatchtuiError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.rollouts:
        return _rollouts_app(args, "model" in given_options(parser, argv))
    try:
        settings = settings_from_args(args)
        given = given_options(parser, argv)
        numbered = texts_from_args(args)
        output_dir = check_output_dir(args.output_dir) if args.output_dir else None
        path = Path(args.session) if args.session else session_file.default_session_path()
        restored = session_file.load(path, set_aside)
        url = _checked_url(args.url)
    except BatchtuiError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    texts = numbered.texts
    notices = [restored.notice] if restored.notice else []
    if cache_notice():
        notices.append(cache_notice())
    if restored.session is not None and not ({"texts", "texts_file"} & given):
        texts = restored.session.texts  # no texts on the command line: the last session's come back
        count = sum(1 for text in texts if text.strip())
        notices.append(
            f"restored {count} text{'s' if count != 1 else ''} and the settings of the last session ({path}); "
            "texts on the command line start afresh"
        )
        asked_trust = settings.trust_remote_code
        settings = _restored_settings(given, settings, restored.session.settings)
        if asked_trust and not settings.trust_remote_code:
            notices.append(
                f"--trust-remote-code is for a model named with --model on the same command line: the session's "
                f"model {literal(settings.model, 60)} loads without running its own code"
            )
    from .app import BatchtuiApp

    notice = " · ".join(notices) or None
    endpoint = None
    if args.url:
        from .run_controller import EndpointTarget

        endpoint = EndpointTarget(url, args.model if "model" in given else None, args.api_key_env)
    app = BatchtuiApp(
        texts, settings, output_dir=output_dir, session_path=path, startup_notice=notice, endpoint=endpoint
    )
    app.runs.threads = args.threads
    return app


def _rollouts_app(args, model_given: bool):
    """`--rollouts FILE`: the app on the rollouts view, its settings checked first (one line, exit 2); a records
    file opens as it is (`model_given`: --model names the tokenizer that shows its tokens)."""
    try:
        from ..core.rollouts.job import RolloutsJob
        from ..core.rollouts.plan import DEFAULT_BATCH_TOKENS
        from ..core.rollouts.saved import saved_rollouts

        output_dir = check_output_dir(args.output_dir) if args.output_dir else None
        # a records file or a report (`batchtui rollouts --records`, `--json`) opens as it is, nothing scored;
        # anything else is rollouts to score
        saved = saved_rollouts(args.rollouts, args.model if model_given else None)
        if saved is not None:
            from .rollouts_app import RolloutsApp

            return RolloutsApp(saved, output_dir)
        settings = settings_from_args(args)
        batch_tokens = DEFAULT_BATCH_TOKENS if args.batch_tokens is None else args.batch_tokens
        job = RolloutsJob(args.rollouts, settings, batch_tokens).checked()
    except BatchtuiError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    from .rollouts_app import RolloutsApp

    return RolloutsApp(job, output_dir)


def _checked_url(url: str | None) -> str | None:
    """The server's API root, refused now (one line, exit 2) rather than in the app's first run."""
    if url is None:
        return None
    from ..core.endpoint.client import base_url

    return base_url(url)


def trusted(model: str, command_line: Settings) -> bool:
    """Whether `model` may run its own code: only when it is the model named with --trust-remote-code."""
    return command_line.trust_remote_code and model == command_line.model


def _restored_settings(given: set[str], current: Settings, saved: Settings) -> Settings:
    """The saved live settings (the model too, since `M` switches it in the app), except those given on the
    command line; none if another model is given there. Remote code runs only for a model named on this
    command line: a model the session brings back loads without it."""
    if "model" in given and saved.model != current.model:
        return current
    changes = {name: getattr(saved, name) for name in restored_settings() if option_dest(name) not in given}
    restored = current.with_changes(**changes)
    return restored.with_changes(trust_remote_code=trusted(restored.model, current))
