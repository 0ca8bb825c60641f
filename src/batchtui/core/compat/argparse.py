"""argparse: the parser's private parts the commands read (its actions, to tell what a command line gave) and the
one method a help formatter overrides to add the defaults."""

from __future__ import annotations

import argparse


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return list(parser._actions)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


class HelpWithDefaults(argparse.HelpFormatter):
    """A formatter whose help of an option is `help_of(action)` (argparse's hook for it is private)."""

    def help_of(self, action: argparse.Action) -> str:
        return action.help or ""

    def _get_help_string(self, action: argparse.Action) -> str:
        return self.help_of(action)
