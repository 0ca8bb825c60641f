"""What `check` and `generate` share: the run (alone, or with each `--remedy`), the table, notes and verdict,
the remedies' table, the JSON report, and the exit code."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..settings import Settings
from .exit_codes import EXIT_DIVERGED, EXIT_OK
from .from_args import settings_from_args, texts_from_args
from .output import check_report_destination, human_output
from .progress import Progress
from .torch_start import start_torch
from .validators import number_within

Result = TypeVar("Result")


@dataclass(frozen=True)
class ReportKind(Generic[Result]):
    """How a command shows and writes its result."""

    table: Callable[[Result], str]  # the table, with what belongs under it
    verdict: Callable[[Result], str]
    to_json: Callable[[Result], dict]
    summary_json: Callable[[Result], dict]
    diverged: Callable[[Result], bool]  # the exit code's question


def report_command(args: argparse.Namespace, run: Callable, kind: Callable[[], ReportKind[Any]]) -> int:
    """`run(texts, settings, lines, sink, progress)` on the arguments' texts and settings (with `--remedy`, once per
    remedy, each with its progress in passes),
    then the table, notes, verdict and report, and with `--repro DIR` the pack (the baseline's logits, handed to
    its run's `sink`). Torch and the engine load only once the arguments are known good."""
    settings = settings_from_args(args)
    numbered = texts_from_args(args)
    check_report_destination(args.json)
    pack = _pack_destination(args)
    start_torch(args)
    shown = kind()
    making = None
    if pack is not None:
        from ..run.repro_pack import PackInTheMaking

        making = PackInTheMaking(pack, args.repro_max_mb)
    sinks = [None if making is None else making.sink]  # the first run is the baseline: its logits go to the pack

    def one_run(texts, run_settings):
        with Progress(args.quiet, unit="pass") as bar:
            return run(texts, run_settings, numbered.lines, sinks.pop() if sinks else None, bar)

    result, outcomes = measured(numbered.texts, settings, args.remedy, one_run)
    out = human_output(args.json)
    print(shown.table(result), file=out)
    for note in result.notes:
        print(f"note: {note}", file=out)
    print(shown.verdict(result), file=out)
    # Built once, for the --json file and the pack alike.
    report = full_report(result, outcomes, shown.to_json, shown.summary_json) if args.json or pack else None
    followed = finish_report(result, outcomes, settings, args.json, report)
    if making is not None:
        assert report is not None  # (made for a pack, above)
        making.write(report, numbered, args.command_line, settings)
        print(f"repro pack written to {making.path}", file=out)
    return EXIT_DIVERGED if shown.diverged(followed) else EXIT_OK


def add_repro_options(parser: argparse.ArgumentParser) -> None:
    from ..reports.pack_reader import DEFAULT_LOGITS_MB

    parser.add_argument(
        "--repro", metavar="DIR", help="write a repro pack to DIR: report, texts, command and both runs' logits"
    )
    parser.add_argument(
        "--repro-max-mb",
        type=float,
        default=DEFAULT_LOGITS_MB,
        metavar="MB",
        help="logits kept in the pack at most (with --from: the largest logits file read)",
    )


def _pack_destination(args: argparse.Namespace):
    if not getattr(args, "repro", None):
        return None
    from ..reports.pack_writer import check_pack_destination

    number_within(args.repro_max_mb, "--repro-max-mb", 0, 1_000_000, low_too=True)  # (0: the pack keeps no logits)
    return check_pack_destination(args.repro)


def measured(texts: list[str], settings: Settings, remedies: list[str], run) -> tuple[Any, list]:
    """`run(texts, settings)` once, or with `--remedy`: the baseline and each remedy (`compare_remedies`).
    Returns the baseline's result and the outcomes (none without remedies)."""
    if not remedies:
        return run(texts, settings), []
    from ..experiments.remedies import compare_remedies

    outcomes = compare_remedies(texts, settings, remedies, run)
    return outcomes[0].comparison, outcomes


def full_report(result, outcomes: list, report_fn, summary_fn) -> dict:
    """The run's JSON report (`report_fn`), with each remedy's entry (`summary_fn` of its run) when measured."""
    from ..reports.report import remedies_json

    report = report_fn(result)
    if outcomes:
        report["remedies"] = remedies_json(outcomes, summary_fn)
    return report


def finish_report(result, outcomes: list, settings: Settings, json_path: str | None, report: dict | None):
    """What `check` and `generate` print after their own table (the invariant mode's verdict, the remedies),
    then the JSON report (`full_report`), after the table so that a report that cannot be written loses nothing
    printed. Returns the result the exit code follows: the run with every applicable remedy, else the baseline."""
    from ..reports.report import write_json
    from ..terminal.plain import format_remedies, invariant_verdict

    out = human_output(json_path)
    if settings.invariant:
        print(f"invariant mode: {invariant_verdict(result)}", file=out)
    if outcomes:
        print(format_remedies(outcomes), file=out)
        invariant = next((o for o in outcomes if o.name.startswith("invariant") and o.comparison is not None), None)
        if invariant is not None:
            from ..experiments.kernel_classes import code_line

            classes = invariant.comparison.config.get("invariant_classes") or ""
            print(code_line(tuple(classes.split(",")) if classes else None), file=out)
    if json_path:
        assert report is not None  # (made wherever a JSON report is asked for)
        write_json(report, json_path)
    return next((o.comparison for o in reversed(outcomes) if o.comparison is not None), result)
