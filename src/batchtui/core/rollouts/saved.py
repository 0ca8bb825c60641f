"""A rollouts run opened again (`batchtui --rollouts FILE`): its records file (`--records`), the summary made from the
records alone, the tokens' text from the tokenizer of the model the run names (or another given), their ids where it
cannot be read; or its report (`--json`), read back (`saved_report`). Nothing is scored, no model loaded, the file
only read, checked as anything from elsewhere is."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError
from ..models.token_text import token_label
from ..numbers.importance import DEFAULTS
from ..numbers.rollouts_summary import RolloutsSummary
from .records import read_records, written_run
from .saved_report import is_report, report_summary
from .tally import RolloutsTally


@dataclass(frozen=True)
class SavedRollouts:
    """A records file or a report to open (`saved_rollouts`)."""

    path: str
    kind: str  # "records" or "report"
    run: dict  # a records file's: the settings of the run that wrote it
    model: str | None = None  # a records file's: whose tokenizer shows the tokens (None: the run's model's)

    def summary(self) -> RolloutsSummary:
        return saved_summary(self.path, self.model) if self.kind == "records" else report_summary(self.path)


def saved_rollouts(path: str, model: str | None = None) -> SavedRollouts | None:
    """Records file or report `path` to open, or None where it is another kind of file (rollouts to score)."""
    if is_report(path):
        return SavedRollouts(path, "report", {})
    run = written_run(path)
    return None if run is None else SavedRollouts(path, "records", run, model)


def saved_summary(path: str, model: str | None = None) -> RolloutsSummary:
    """The summary of records file `path`, as the run that wrote it would have made it over its records (the
    default correction settings); `model`: whose tokenizer shows the tokens (default: the run's)."""
    started = time.perf_counter()
    run = written_run(path)
    if run is None:
        raise InputError(f"{path} is not a records file of `batchtui rollouts` (its first line says which run)")
    decode, label = _texts(model or str(run.get("model", "")))
    tally = RolloutsTally(DEFAULTS)
    try:
        count = 0
        for record in read_records(path, {}, repair=False):
            tally.add(record)
            count += 1
        if not count:
            raise InputError(f"records file {path} holds no records")
        config = {**run, "records": path}
        return tally.summary(decode, label, config=config, skipped=0, faults=(), resumed=0,
                             elapsed_s=time.perf_counter() - started)  # fmt: skip
    finally:
        tally.close()


def _texts(model: str) -> tuple[Callable[[list[int]], str], Callable[[int], str]]:
    """(a completion's text, a token's label) from `model`'s tokenizer, or from the ids where it cannot be read (a
    Hub model not on this machine, a path gone)."""
    from ..models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        return (lambda ids: " ".join(f"<id={i}>" for i in ids)), (lambda i: f"<id={i}>")

    def label(token: int) -> str:
        text, piece = tokenizer.decode([token]), tokenizer.convert_ids_to_tokens(token)
        return token_label(text, piece) or f"<id={token}>"

    return tokenizer.decode, label
