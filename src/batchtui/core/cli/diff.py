"""`batchtui diff A B`: two reports or repro packs of the same texts and model, from two machines or two settings."""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..terminal.plain import format_columns, format_float
from ..visible import literal
from .exit_codes import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK, error_line, parsed_and_guarded
from .output import check_report_destination, human_output
from .parser import OneLineParser
from .shared_options import add_shared

DESCRIPTION = (
    "Compare two JSON reports or repro packs (--repro) of the same texts and model: environment differences, "
    "settings, then per text the verdicts, max|Δ|, flips and first split of both, and where both are packs, the "
    "cross-machine max|Δ| of the logits alone and batched. Exit 0 when the results agree, 1 when they differ, "
    "2 when A and B are not runs of the same texts and model (or on bad input)."
)


def run_diff(argv: list[str], prog: str = "batchtui diff") -> int:
    parser = OneLineParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("a", metavar="A", help="a report (.json) or a repro pack folder")
    parser.add_argument("b", metavar="B", help="another, of the same texts and model")
    add_shared(parser, "--json")
    return parsed_and_guarded(parser, argv, _diff)


def _number(value) -> str:
    return "" if value is None else format_float(value)


def _logits(match) -> str:
    if match is None:
        return ""
    return "bitwise" if match.bitwise_equal else format_float(match.max_abs_diff)


def _diff(args: argparse.Namespace) -> int:
    import sys

    from ..reports.diff import diff_runs, load_run, not_comparable
    from ..reports.report import write_json

    check_report_destination(args.json)
    a, b = load_run(args.a), load_run(args.b)
    reason = not_comparable(a, b)
    if reason is not None:
        print(error_line(InputError(f"{args.a} and {args.b} are not runs of the same texts and model: {reason}")),
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    found = diff_runs(a, b)
    out = human_output(args.json)
    print(f"environment: {len(found.environment)} differences" + (" (A → B)" if found.environment else ""), file=out)
    for name, va, vb in found.environment:
        print(f"  {literal(str(name), 80)}: {literal(str(va), 50)} → {literal(str(vb), 50)}", file=out)
    print(f"settings: {len(found.settings)} differences" + (" (A → B)" if found.settings else ""), file=out)
    for name, va, vb in found.settings:
        print(f"  {literal(str(name), 80)}: {literal(str(va), 50)} → {literal(str(vb), 50)}", file=out)
    header = ("#", "text", "A", "B", "max|Δ| A", "max|Δ| B", "flips A/B", "split A/B", "alone A↔B", "batched A↔B")
    rows = [
        (
            str(t.line),
            literal(t.text, 28),
            t.a.verdict,
            t.b.verdict,
            _number(t.a.max_abs_diff),
            _number(t.b.max_abs_diff),
            f"{_count(t.a.flips)}/{_count(t.b.flips)}",
            f"{_count(t.a.first_split)}/{_count(t.b.first_split)}",
            _logits(t.single),
            _logits(t.batched),
        )
        for t in found.texts
    ]
    print(format_columns(header, rows, left={1, 2, 3}), file=out)
    verdict = _verdict(found)
    if found.settings:
        verdict += f"; settings differ ({', '.join(literal(str(name), 40) for name, _, _ in found.settings)})"
    print(verdict, file=out)
    if args.json:
        write_json(_diff_json(found), args.json)
    return EXIT_OK if found.agrees else EXIT_DIVERGED


def _verdict(found) -> str:
    """Counted by what changed: a verdict (allclose/diverged, same/differs), then the logits across machines; texts
    whose verdict holds while max|Δ|, flips or the split moved are said apart, with how far max|Δ| moved."""
    total = len(found.texts)
    changed = sum(t.verdict_changed for t in found.texts)
    logits = sum(t.logits_differ for t in found.texts)
    moved = [t for t in found.texts if t.agrees and t.measures_moved]
    parts = []
    if changed:
        parts.append(f"{changed} of {total} texts change verdict")
    if logits:
        parts.append(f"{logits} of {total} texts' logits are not bitwise the same across the two")
    line = f"the results differ: {', '.join(parts)}" if parts else f"the results agree: every verdict of {total} texts"
    if moved:
        largest = max(t.max_abs_diff_change for t in moved)
        line += (
            f"; {len(moved)} {'more ' if parts else ''}{'texts keep' if len(moved) > 1 else 'text keeps'} the "
            f"verdict with another max|Δ|, flips or split (max|Δ| moved by up to {format_float(largest)})"
        )
    return line


def _count(value) -> str:
    return "-" if value is None else str(value)


def _diff_json(found) -> dict:
    from dataclasses import asdict

    from ..reports.report import number

    def match(m):
        return None if m is None else {**asdict(m), "max_abs_diff": number(m.max_abs_diff)}

    return {
        "agrees": found.agrees,
        "environment_differences": [{"field": f, "a": a, "b": b} for f, a, b in found.environment],
        "settings_differences": [{"field": f, "a": a, "b": b} for f, a, b in found.settings],
        "texts": [
            {
                "index": t.index,
                "line": t.line,
                "text": t.text,
                "agrees": t.agrees,
                "verdict_changed": t.verdict_changed,
                "measures_moved": t.measures_moved,
                "a": asdict(t.a),
                "b": asdict(t.b),
                "logits_alone": match(t.single),
                "logits_batched": match(t.batched),
            }
            for t in found.texts
        ],
    }
