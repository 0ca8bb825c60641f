"""What the app's ctrl+s writes: the comparison on screen and every result the user ran from it (the
generation view, the sweep, the remedies), in the sections `check`, `generate` and `sweep` write."""

from __future__ import annotations

from dataclasses import asdict

from ..numbers.comparison import Comparison
from ..numbers.generation_result import GenerationComparison
from .generation_json import generation_json
from .report import remedies_json, summary_json, to_json_dict


def explorer_report(
    comparison: Comparison,
    generation: GenerationComparison | None = None,
    sweep: tuple | None = None,
    remedies: list | None = None,
) -> dict:
    """`sweep` is (dtypes, batch sizes, cells); `remedies` the remedies screen's outcomes."""
    report = to_json_dict(comparison)
    if generation is not None:
        report["generation"] = generation_json(generation)
    if sweep is not None:
        dtypes, batch_sizes, cells = sweep
        report["sweep"] = {
            "dtypes": list(dtypes),
            "batch_sizes": list(batch_sizes),
            "cells": [asdict(cell) for cell in cells],
        }
    if remedies:
        report["remedies"] = remedies_json(remedies, summary_json)
    return report


def sections(report: dict) -> list[str]:
    """The parts a report holds, in words, for the message that says where it went."""
    named = {"generation": "generation", "sweep": "sweep", "remedies": "remedies"}
    return ["comparison", *(word for key, word in named.items() if key in report)]
