"""What a command's arguments build: the run's settings and its numbered texts, checked before any model loads."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..errors import InputError
from ..settings import DEFAULT_ATOL, DEFAULT_RTOL, Settings
from ..texts import DEFAULT_TEXTS, NumberedTexts, read_texts_file, validate_texts


def settings_from_args(args: argparse.Namespace, ignored: tuple[str, ...] = ()) -> Settings:
    """The settings the arguments name (each option's dest is its Settings field), checked. `ignored`: options
    of the same name that mean something else to the command."""
    given = {f.name: getattr(args, f.name) for f in fields(Settings) if hasattr(args, f.name) and f.name not in ignored}
    if getattr(args, "bitwise", False):
        if given.get("atol") not in (0, DEFAULT_ATOL) or given.get("rtol") not in (0, DEFAULT_RTOL):
            raise InputError("--bitwise is --atol 0 --rtol 0: give it or other tolerances, not both")
        given.update(atol=0.0, rtol=0.0)
    if getattr(args, "ops", False):
        given["modules"] = True  # a first op is looked for inside a text's first divergent module
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
