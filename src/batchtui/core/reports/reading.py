"""A JSON report read back (`diff`'s A and B, a repro pack's report.json): one schema, checked before any use.

Only the fields that `diff` and `check --from` read are checked; a report may carry more (reports grow fields
freely). Every one that is read has the type the reading code expects, or the file is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from ..untrusted import MiB, check, field, list_of, read_json

MAX_REPORT_BYTES = 256 * MiB  # a check report of thousands of texts with top-k 20 stays far below


def read_report(path: str | Path, what: str = "report") -> dict:
    return validated_report(read_json(path, MAX_REPORT_BYTES, what), f"{what} {path}")


def validated_report(report: object, where: str) -> dict:
    """`report` if it has the shape of a batchtui report of texts (check, generate or endpoint), else InputError."""
    checked: dict = check(report, "object", where)
    config = field(checked, "config", "object", where)
    for key in ("model", "dtype"):
        field(config, key, "string", f"{where}: config", optional=True)
    for key in ("max_new_tokens", "vocab_size"):
        field(config, key, "whole number", f"{where}: config", optional=True)
    for index, entry in enumerate(field(checked, "texts", "list", where)):
        _check_text(entry, f"{where}: texts[{index}]")
    environment = field(checked, "environment", "object", where, optional=True)
    if environment is not None:
        identity = field(environment, "identity", "object", f"{where}: environment", optional=True) or {}
        for key in ("model", "config_sha256", "weights_sha256", "tokenizer_sha256"):
            field(identity, key, "string", f"{where}: environment.identity", optional=True)
    return checked


def _check_text(value: object, where: str) -> None:
    entry: dict = check(value, "object", where)
    field(entry, "text", "string", where)
    field(entry, "line", "whole number", where, optional=True)
    if "tokens" in entry:
        list_of(entry["tokens"], "string", f"{where}: 'tokens'")
    for key in ("allclose", "differs"):
        field(entry, key, "true or false", where, optional=True)
    for key in ("top1_flips", "split_step", "prompt_tokens"):
        field(entry, key, "whole number", where, optional=True)
    field(entry, "max_abs_diff", "number", where, optional=True)
    for index, position in enumerate(field(entry, "positions", "list", where, optional=True) or []):
        check(position, "object", f"{where}: positions[{index}]")
        field(position, "index", "whole number", f"{where}: positions[{index}]")
        field(position, "max_abs_diff", "number", f"{where}: positions[{index}]", optional=True)
