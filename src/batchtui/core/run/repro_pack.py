"""A repro pack made from a run: compare the texts keeping both runs' logits, then write the pack
(`reports.pack_writer`)."""

from __future__ import annotations

from pathlib import Path

from ..one_run import one_run_at_a_time
from ..reports.pack_reader import DEFAULT_LOGITS_MB
from ..reports.pack_writer import KeptLogits, check_command, write_pack
from ..settings import Settings


@one_run_at_a_time()  # the kept logits are written as tensors: still the run's
def make_pack(path: Path, texts: list[str], lines: list[int], settings: Settings, progress=None, cancelled=None):
    """Compare `texts` under `settings` keeping both runs' logits, and write the pack to `path` (checked new)."""
    from ..reports.report import to_json_dict
    from .engine import compare

    kept = KeptLogits(DEFAULT_LOGITS_MB * 2**20)
    result = compare(texts, settings, progress, cancelled, lines, logits_sink=kept)
    write_pack(path, to_json_dict(result), texts, lines, check_command(settings), settings, kept)
    return result
