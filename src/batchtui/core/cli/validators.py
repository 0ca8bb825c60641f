"""Argument types and checks the commands share: whole numbers in a range, finite numbers, comma-separated lists, each
refused in one message."""

from __future__ import annotations

import argparse
import math

from ..errors import InputError
from ..experiments.sweep import parse_batch_sizes, parse_counts, parse_names


def number_within(value: float, option: str, low: float, high: float, unit: str = "", low_too: bool = False) -> float:
    """`value` where it is a finite number above `low` (or `low` itself, with `low_too`) and at most `high`; else
    InputError naming `option` (an infinite timeout or a NaN limit would otherwise reach the code that uses it)."""
    if not (math.isfinite(value) and (low <= value if low_too else low < value) and value <= high):
        bound = "at least" if low_too else "above"
        raise InputError(f"{option} must be a number {bound} {low:g} and at most {high:g}{unit}, not {value:g}")
    return value


def int_at_least(minimum: int):
    """An argparse type: a whole number of at least `minimum`, in one message either way."""

    def parsed(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, not {value!r}")
        return number

    return parsed


def int_within(minimum: int, maximum: int, why: str = ""):
    """An argparse type: a whole number from `minimum` to `maximum` (`why`: what the maximum is), in one message
    either way."""
    at_least = int_at_least(minimum)
    bound = f"{maximum} ({why})" if why else str(maximum)

    def parsed(value: str) -> int:
        number = at_least(value)
        if number > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {bound}, not {value!r}")
        return number

    return parsed


def _as_argument(parse):
    """A core parser as an argparse type: its InputError becomes argparse's own message."""

    def parsed(value: str):
        try:
            return parse(value)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


names_argument = _as_argument(parse_names)  # "a,b,c" -> ["a", "b", "c"]
ints_argument = _as_argument(parse_batch_sizes)  # "1,2,4" -> [1, 2, 4]
levels_argument = _as_argument(lambda value: parse_counts(value, "concurrency levels"))
