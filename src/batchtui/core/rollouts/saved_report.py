"""A `batchtui rollouts --json` report opened again (`batchtui --rollouts REPORT.json`): its summary read back, nothing
scored, no model loaded. A report may come from elsewhere: it is read bounded (at most `MAX_REPORT_BYTES`) and every
field checked for its type and size; a report that is not one is a line naming the first field that is not."""

from __future__ import annotations

import json
import math
from dataclasses import fields

from ..errors import InputError
from ..numbers.importance import ImportanceMetrics
from ..numbers.rollouts_summary import (
    BatchNoise,
    DeltaBand,
    Histogram,
    RolloutsSummary,
    ScoredToken,
    WorstSequence,
    WorstToken,
)
from ..numbers.trl_parts import TrlParts
from ..untrusted import open_regular, read_capped

MAX_REPORT_BYTES = 256 << 20  # as `report.json` in a repro pack
_MANY = 100_000  # the most entries any list of a report holds (tokens of a sequence, steps, groups)
_TEXT = 1_000_000  # the longest string (a completion's text)


class _NotAReport(Exception):
    """A field that is not what the report writes (its name)."""


def is_report(path: str) -> bool:
    """Whether `path` begins as a JSON report does (`{` alone on its first line, where a JSONL line holds a whole
    object)."""
    with open_regular(path, "rollouts file") as handle:
        return handle.readline(64).strip() == b"{"


def report_summary(path: str) -> RolloutsSummary:
    raw = read_capped(path, MAX_REPORT_BYTES, "report")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("rollouts"), dict):
            raise _NotAReport("rollouts")
        return _summary(_config(data.get("config")), data["rollouts"])
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{path} is not JSON: not a `batchtui rollouts --json` report") from None
    except _NotAReport as field:
        raise InputError(f"{path}: its {field} is not a `batchtui rollouts --json` report's") from None


def _config(config) -> dict:
    if not isinstance(config, dict):
        raise _NotAReport("config")
    return {str(k)[:100]: v for k, v in config.items() if v is None or isinstance(v, (str, int, float, bool))}


def _summary(config: dict, r: dict) -> RolloutsSummary:
    percentiles = _get(r, "abs_diff_percentiles", dict)
    return RolloutsSummary(
        config=config,
        metrics=_metrics(r, ""),
        abs_diff_percentiles={
            str(k)[:20]: _float(v, "abs_diff_percentiles") for k, v in list(percentiles.items())[:20]
        },
        delta_histogram=_histogram(_get(r, "delta_histogram", dict), "delta_histogram"),
        ratio_histogram=_histogram(_get(r, "ratio_histogram", dict), "ratio_histogram"),
        worst_sequences=tuple(_sequence(s) for s in _list(r, "worst_sequences", dict)),
        worst_tokens=tuple(
            WorstToken(_int(w.get("line"), "worst_tokens"), _token(w)) for w in _list(r, "worst_tokens", dict)
        ),
        skipped=_int(r.get("skipped"), "skipped"),
        faults=tuple(_text(f, "faults")[:1000] for f in _list(r, "faults", str)),
        resumed=_int(r.get("resumed"), "resumed"),
        elapsed_s=_float(r.get("elapsed_s"), "elapsed_s"),
        by_position=tuple(_band(b, "by_position") for b in _list(r, "by_position", dict)),
        by_entropy=tuple(_band(b, "by_entropy") for b in _list(r, "by_entropy", dict)),
        max_kl=_maybe_float(r.get("max_kl"), "max_kl"),
        batch_noise=_noise(r.get("batch_noise")),
        trl_parts=_parts(r.get("trl_parts")),
        masked_tokens=_int(r.get("masked_tokens", 0), "masked_tokens"),
        by_step=tuple((_int(e.get("step"), "by_step"), _metrics(e, "by_step")) for e in _list(r, "by_step", dict)),
        by_group=tuple((_group(e.get("group")), _metrics(e, "by_group")) for e in _list(r, "by_group", dict)),
    )


def _metrics(entry: dict, where: str) -> ImportanceMetrics:
    values: dict[str, int | float | None] = {}
    for f in fields(ImportanceMetrics):
        name = f"{where}.{f.name}" if where else f.name
        value = entry.get(f.name)
        if f.name in ("sequences", "tokens"):
            values[f.name] = _int(value, name)
        elif f.name == "top1_disagree":
            values[f.name] = None if value is None else _int(value, name)
        else:
            values[f.name] = _maybe_float(value, name)
    return ImportanceMetrics(**values)  # type: ignore[arg-type]


def _histogram(h: dict, name: str) -> Histogram:
    edges = tuple(_float(e, name) for e in _list(h, "edges", (int, float, type(None)), name))
    counts = tuple(_int(c, name) for c in _list(h, "counts", int, name))
    if len(edges) > 1000 or (edges or counts) and len(edges) != len(counts) + 1:
        raise _NotAReport(name)
    return Histogram(edges, counts)


def _sequence(s: dict) -> WorstSequence:
    steps = tuple(_token(t) for t in _list(s, "steps", dict, "worst_sequences"))
    name = "worst_sequences"
    return WorstSequence(_int(s.get("line"), name), _float(s.get("log_ratio"), name),
                         _float(s.get("max_abs_diff"), name), _text(s.get("completion"), name), steps)  # fmt: skip


def _token(t: dict) -> ScoredToken:
    top1, sampler_top1 = t.get("top1_disagree"), t.get("sampler_top1")  # (absent from the reports before them)
    if top1 is not None and not isinstance(top1, bool):
        raise _NotAReport("top1_disagree")
    if sampler_top1 is not None:
        sampler_top1 = _text(sampler_top1, "sampler_top1")
    return ScoredToken(_int(t.get("step"), "step"), _int(t.get("token_id"), "token_id"), _text(t.get("token"), "token"),
                       _float(t.get("trainer_logprob"), "trainer_logprob"),
                       _float(t.get("sampler_logprob"), "sampler_logprob"), top1, sampler_top1)  # fmt: skip


def _band(b: dict, name: str) -> DeltaBand:
    high = b.get("high")
    return DeltaBand(_float(b.get("low"), name), math.inf if high is None else _float(high, name),
                     _int(b.get("tokens"), name), _float(b.get("mean_abs_diff"), name),
                     _float(b.get("max_abs_diff"), name))  # fmt: skip


def _noise(n) -> BatchNoise | None:
    if n is None:
        return None
    if not isinstance(n, dict):
        raise _NotAReport("batch_noise")
    name = "batch_noise"
    lines = tuple(_int(v, name) for v in _list(n, "lines", int, name))
    return BatchNoise(lines, _int(n.get("tokens"), name), _int(n.get("moved"), name),
                      _float(n.get("max_abs_diff"), name), _int(n.get("moved_in_mode"), name))  # fmt: skip


def _parts(p) -> TrlParts | None:
    if p is None:
        return None
    if not isinstance(p, dict):
        raise _NotAReport("trl_parts")
    return TrlParts(_int(p.get("tokens"), "trl_parts"), _int(p.get("by_positions"), "trl_parts"),
                    _float(p.get("max_by_positions"), "trl_parts"), _int(p.get("by_head"), "trl_parts"),
                    _float(p.get("max_by_head"), "trl_parts"))  # fmt: skip


def _group(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _NotAReport("by_group")
    return str(value)[:200]


def _get(entry: dict, key: str, kind: type):
    value = entry.get(key)
    if not isinstance(value, kind):
        raise _NotAReport(key)
    return value


def _list(entry: dict, key: str, kind, where: str = "") -> list:
    value = entry.get(key)
    name = where or key
    if not isinstance(value, list) or len(value) > _MANY or not all(isinstance(v, kind) for v in value):
        raise _NotAReport(name)
    if kind is not dict:  # (a bool is an int to isinstance: not a count)
        if any(isinstance(v, bool) for v in value):
            raise _NotAReport(name)
    return value


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _NotAReport(name)
    return value


def _float(value, name: str) -> float:
    """A number; null (how a report writes a non-finite one) reads as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotAReport(name)
    return float(value)


def _maybe_float(value, name: str) -> float | None:
    return None if value is None else _float(value, name)


def _text(value, name: str) -> str:
    if not isinstance(value, str) or len(value) > _TEXT:
        raise _NotAReport(name)
    return value
