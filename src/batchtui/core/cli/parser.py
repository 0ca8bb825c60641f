"""The parser every batchtui command uses: usage errors as one line, each option's default in --help, and which
options a command line gives."""

from __future__ import annotations

import argparse
import copy

from ..compat.argparse import HelpWithDefaults, actions, option_strings


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


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the options `argv` gives explicitly, even when given at their default value
    (`--batch-size 8` must beat a session's 4, though 8 is the default)."""
    not_given = object()  # not a string, so argparse never runs it through an option's type
    probe = copy.deepcopy(parser)
    probe.set_defaults(**{action.dest: not_given for action in actions(probe)})
    return {dest for dest, value in vars(probe.parse_args(argv)).items() if value is not not_given}
