"""What `check` and `generate` share: the run (alone, or with each `--remedy`), the table, notes and verdict,
the remedies' table, the JSON report, and the exit code."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from .cli_exit import EXIT_DIVERGED, EXIT_OK
from .cli_options import check_report_destination, human_output, settings_from_args, texts_from_args
from .settings import Settings


@dataclass(frozen=True)
class ReportKind:
    """How a command shows and writes its result."""

    table: Callable[[object], str]  # the table, with what belongs under it
    verdict: Callable[[object], str]
    to_json: Callable[[object], dict]
    summary_json: Callable[[object], dict]
    diverged: Callable[[object], bool]  # the exit code's question


def report_command(args: argparse.Namespace, run: Callable, kind: Callable[[], ReportKind]) -> int:
    """`run(texts, settings, lines)` on the arguments' texts and settings (with `--remedy`, once per remedy),
    then the table, notes, verdict and report. `kind` is called once the arguments are known good: the
    engine, and torch with it, load only then."""
    settings = settings_from_args(args)
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    shown = kind()
    result, outcomes = measured(
        numbered.texts, settings, args.remedy, lambda texts, run_settings: run(texts, run_settings, numbered.lines)
    )
    out = human_output(args.json)
    print(shown.table(result), file=out)
    for note in result.notes:
        print(f"note: {note}", file=out)
    print(shown.verdict(result), file=out)
    followed = finish_report(result, outcomes, settings, args.json, shown.to_json, shown.summary_json)
    return EXIT_DIVERGED if shown.diverged(followed) else EXIT_OK


def measured(texts: list[str], settings: Settings, remedies: list[str], run) -> tuple[object, list]:
    """`run(texts, settings)` once, or with `--remedy`: the baseline and each remedy (`compare_remedies`).
    Returns the baseline's result and the outcomes (none without remedies)."""
    if not remedies:
        return run(texts, settings), []
    from .remedies import compare_remedies

    outcomes = compare_remedies(texts, settings, remedies, run)
    return outcomes[0].comparison, outcomes


def finish_report(result, outcomes: list, settings: Settings, json_path: str | None, report_fn, summary_fn):
    """What `check` and `generate` print after their own table (the invariant mode's verdict, the remedies),
    then the JSON report, after the table so that a report that cannot be written loses nothing printed.
    Returns the result the exit code follows: the run with every applicable remedy, else the baseline."""
    from .plain_text import format_remedies, invariant_verdict
    from .report import remedies_json, write_json

    out = human_output(json_path)
    if settings.invariant:
        print(f"invariant mode: {invariant_verdict(result)}", file=out)
    if outcomes:
        print(format_remedies(outcomes), file=out)
    if json_path:
        report = report_fn(result)
        if outcomes:
            report["remedies"] = remedies_json(outcomes, summary_fn)
        write_json(report, json_path)
    return next((o.comparison for o in reversed(outcomes) if o.comparison is not None), result)
