"""The options every batchtui command shares (docs/cli.md's contract), and what they build."""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import fields
from typing import TextIO

from ..compat.argparse import HelpWithDefaults, actions, option_strings
from ..errors import InputError
from ..experiments.remedies import REMEDIES
from ..safe_files import check_writable_file, is_standard_output
from ..settings import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    Settings,
)
from ..texts import DEFAULT_TEXTS, NumberedTexts, read_texts_file, validate_texts
from ..threads import THREADS_PER_CORE, most_threads
from ..visible import literal
from .shared_options import add_shared
from .validators import int_within


class _DefaultsShown(HelpWithDefaults):
    """Adds `(default: X)` to an option's help unless it says its default already (or has none)."""

    def help_of(self, action: argparse.Action) -> str:
        text = action.help or ""
        no_default = action.default in (None, False, argparse.SUPPRESS, "") or action.default == []
        if not action.option_strings or "default" in text or no_default:
            return text
        default = ",".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        return f"{text} (default: {default})" if text else f"default: {default}"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2, never a traceback or a usage dump; --help shows every
    option's default."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(**kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        # `--invariant=CLASSES` is `--invariant-classes CLASSES`: `--invariant` itself stays a flag, so that the text
        # after it is never read as its value.
        if args is not None and any(a.startswith("--invariant-classes") for a in option_strings(self)):
            if "--invariant=" in args:  # (empty: it would run without the mode and pass)
                self.error("--invariant= names none of the mode's classes: give them, or --invariant alone")
            args = [f"--invariant-classes={a.split('=', 1)[1]}" if a.startswith("--invariant=") else a for a in args]
        return super().parse_known_args(args, namespace)


def command_parser(prog: str, description: str) -> OneLineParser:
    """A command's parser with the options every comparing command takes."""
    parser = OneLineParser(prog=prog, description=description)
    add_common_options(parser)
    return parser


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to compare (default: a built-in set)")
    parser.add_argument("--texts-file", metavar="FILE", help="read texts from FILE, one per line")
    add_shared(parser, "--model", "--dtype", "--device", "--device-map", "--batch-size", "--padding-side")
    add_shared(parser, "--positions", "--attn")
    parser.add_argument(
        "--max-tokens", type=int, metavar="N", help="cut longer texts to N tokens, flagged (default: the context)"
    )
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="top tokens kept per position")
    add_shared(parser, "--atol", "--rtol")
    parser.add_argument(
        "--bitwise",
        action="store_true",
        help="judge bitwise: a text passes only where every logit is the same in both runs (--atol 0 --rtol 0)",
    )
    add_shared(parser, "--trust-remote-code")
    add_threads_option(parser)
    parser.add_argument(
        "--modules", action="store_true", help="localize per module: norms, attention, MLP, residual of each layer"
    )
    # The option's earlier name, kept working for scripts that use it.
    parser.add_argument("--layers", dest="modules", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--decompose", action="store_true", help="also run each padded row alone: batch-size vs padding effect"
    )
    parser.add_argument("--reference", action="store_true", help="also run each text alone in float64 on the CPU")
    add_shared(parser, "--invariant", "--invariant-classes")


def add_trainer_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trainer",
        choices=("batchtui", "trl"),
        default="batchtui",
        help="how the trainer's forward calls the model: batchtui (positions counted from each row's first token, "
        "log_softmax of the float32 logits) or trl (as TRL 1.16's GRPOTrainer does: no position ids, its fused LM "
        "head); with trl the report says which of the two moves the logprobs (default: batchtui)",
    )


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int_within(1, most_threads(), f"{THREADS_PER_CORE} times this machine's cores"),
        metavar="N",
        help="CPU threads for torch's kernels, at most 4 times the cores (default: torch's own, the same on every run "
        "on this machine; the count can change CPU results, so give the same N to runs you compare)",
    )


def start_torch(args: argparse.Namespace, keep_freed: bool = True) -> None:
    """Torch loaded and set up for the run: its kernel threads (`--threads`) and, with `keep_freed`, the allocator
    keeping freed blocks for reuse (a run of thousands of batches of other shapes would grow its heap with them).
    Each command calls it once its arguments are known good, so a bad value is refused without the import (about two
    seconds). A cache folder that cannot be used is said here, once: the run goes on without it. What the mode
    measures on its first use is said as it goes (`MeasuringLine`)."""
    from ..cache_folder import cache_notice
    from ..invariant.measuring import listen
    from ..numbers.cpu_memory import keep_freed_memory
    from ..threads import use_threads
    from .measuring_line import MeasuringLine

    if notice := cache_notice():
        print(f"batchtui: notice: {literal(notice)}", file=sys.stderr)
    listen(MeasuringLine())  # the mode's first passes on this machine measure its kernels: said as they do
    use_threads(args.threads)
    if keep_freed:
        keep_freed_memory()


def add_remedy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remedy",
        action="append",
        default=[],
        metavar="NAME",
        help=f"measure a remedy before/after (repeatable): {', '.join(REMEDIES)}, invariant:CLASS+CLASS (the mode's "
        "parts alone); the exit code then follows the "
        "run with all applied",
    )


def settings_from_args(args: argparse.Namespace, ignored: tuple[str, ...] = ()) -> Settings:
    """The settings the arguments name (each option's dest is its Settings field), checked. `ignored`: options
    of the same name that mean something else to the command."""
    given = {f.name: getattr(args, f.name) for f in fields(Settings) if hasattr(args, f.name) and f.name not in ignored}
    if getattr(args, "bitwise", False):
        if given.get("atol") not in (0, DEFAULT_ATOL) or given.get("rtol") not in (0, DEFAULT_RTOL):
            raise InputError("--bitwise is --atol 0 --rtol 0: give it or other tolerances, not both")
        given.update(atol=0.0, rtol=0.0)
    if given.get("invariant_classes"):
        given["invariant"] = True  # naming the mode's parts asks for the mode
    return Settings(**given).validated()


def texts_from_args(args: argparse.Namespace) -> NumberedTexts:
    """Texts from the command line (numbered by position), then --texts-file (numbered by file line);
    the default set when neither gives any. Checked here, before any model loads."""
    texts, lines = list(args.texts), list(range(1, len(args.texts) + 1))
    if args.texts_file:
        from_file = read_texts_file(args.texts_file)
        if not from_file.texts and not texts:
            raise InputError(f"texts file {args.texts_file!r} has no texts")
        texts += from_file.texts
        lines += from_file.lines
    if not texts:
        texts, lines = list(DEFAULT_TEXTS), list(range(1, len(DEFAULT_TEXTS) + 1))
    validate_texts(texts, lines)
    return NumberedTexts(texts, lines)


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options `argv` gives explicitly, even when given at their default value
    (`--batch-size 8` must beat a session's 4, though 8 is the default)."""
    not_given = object()  # not a string, so argparse never runs it through an option's type
    probe = copy.deepcopy(parser)
    probe.set_defaults(**{action.dest: not_given for action in actions(probe)})
    return {dest for dest, value in vars(probe.parse_args(argv)).items() if value is not not_given}


def human_output(json_path: str | None) -> TextIO:
    """Where tables and verdicts go: stderr when the JSON report takes stdout (`-`, `/dev/stdout`), so that
    the report stays parseable; stdout otherwise."""
    return sys.stderr if json_path and is_standard_output(json_path) else sys.stdout


def check_report_destination(path: str | None) -> None:
    """Refuse a --json destination that could not be written, before the run rather than after it."""
    if path:
        check_writable_file(path, "cannot write the report to")
