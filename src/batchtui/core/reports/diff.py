"""Two runs of the same texts on the same model, from two machines or two settings: what differs.

A run is a JSON report (`check`, `generate`, `endpoint`) or a repro pack (its report and logits). Environments
are compared field by field, then the settings, then each text's verdict, max|Δ|, flips and first split; where
both are packs, the two machines' logits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..numbers.logits_match import LogitsMatch, match_logits
from .environment import differences
from .pack_reader import Pack, read_pack
from .reading import read_report

# Settings every report resolves that say nothing about the numbers.
_NOT_SETTINGS = ("device_map", "trust_remote_code", "pad_token_id", "vocab_size", "url")
# Environment fields that differ between two machines without changing a number, or that name the run itself.
_NOT_ENVIRONMENT = ("fingerprint", "identity.folder", "texts_sha256")


@dataclass(frozen=True)
class RunOf:
    name: str
    report: dict
    pack: Pack | None


def load_run(path: str) -> RunOf:
    if Path(path).expanduser().is_dir():
        pack = read_pack(path)
        return RunOf(path, pack.report, pack)
    report = read_report(path)
    return RunOf(path, report, None)


@dataclass(frozen=True)
class TextOutcome:
    verdict: str
    max_abs_diff: float | None
    flips: int | None
    first_split: int | None


def _outcome(entry: dict) -> TextOutcome:
    if "allclose" in entry:  # check
        first = next((p["index"] for p in entry.get("positions", []) if p.get("max_abs_diff")), None)
        verdict = "allclose" if entry["allclose"] else "diverged"
        return TextOutcome(verdict, entry.get("max_abs_diff"), entry.get("top1_flips"), first)
    verdict = {True: "differs", False: "same", None: "not measured"}[entry.get("differs")]
    return TextOutcome(verdict, entry.get("max_abs_diff"), None, entry.get("split_step"))


@dataclass(frozen=True)
class TextDiff:
    index: int
    line: int
    text: str
    a: TextOutcome
    b: TextOutcome
    single: LogitsMatch | None  # the two machines' logits alone, where both are packs
    batched: LogitsMatch | None

    @property
    def verdict_changed(self) -> bool:
        return self.a.verdict != self.b.verdict

    @property
    def logits_differ(self) -> bool:
        """The two machines' logits are not bitwise the same (only where both are packs)."""
        return not all(m is None or m.bitwise_equal for m in (self.single, self.batched))

    @property
    def agrees(self) -> bool:
        """The same verdict and, where both are packs, the same logits; max|Δ|, flips or the split may move."""
        return not self.verdict_changed and not self.logits_differ

    @property
    def measures_moved(self) -> bool:
        """The verdict holds, but max|Δ|, the flips or the first split changed."""
        return self.a != self.b

    @property
    def max_abs_diff_change(self) -> float:
        """How far max|Δ| moved between A and B (0 where either did not measure it)."""
        if self.a.max_abs_diff is None or self.b.max_abs_diff is None:
            return 0.0
        return abs(self.a.max_abs_diff - self.b.max_abs_diff)


@dataclass(frozen=True)
class RunDiff:
    environment: list[tuple[str, object, object]]
    settings: list[tuple[str, object, object]]
    texts: list[TextDiff]

    @property
    def agrees(self) -> bool:
        return not self.settings and all(t.agrees for t in self.texts)


def not_comparable(a: RunOf, b: RunOf) -> str | None:
    """Why A and B are not runs of the same texts and model (None when they are)."""
    texts_a = [t["text"] for t in a.report["texts"]]
    texts_b = [t["text"] for t in b.report["texts"]]
    if texts_a != texts_b:
        return f"the texts differ ({len(texts_a)} in {a.name}, {len(texts_b)} in {b.name}, not the same list)"
    ia = (a.report.get("environment") or {}).get("identity") or {}
    ib = (b.report.get("environment") or {}).get("identity") or {}
    for field in ("config_sha256", "weights_sha256", "tokenizer_sha256"):
        if ia.get(field) and ib.get(field) and ia[field] != ib[field]:
            files = field.split("_")[0]
            return f"the models differ: their {files} files are not the same ({ia.get('model')} vs {ib.get('model')})"
    if not (ia.get("weights_sha256") and ib.get("weights_sha256")):
        ma, mb = a.report["config"].get("model"), b.report["config"].get("model")
        if ma != mb:
            return f"the models differ: {ma} vs {mb}"
    return None


def diff_runs(a: RunOf, b: RunOf) -> RunDiff:
    environment = differences(a.report.get("environment") or {}, b.report.get("environment") or {}, _NOT_ENVIRONMENT)
    ca, cb = a.report["config"], b.report["config"]
    differ = {k for k in ca.keys() | cb.keys() if k not in _NOT_SETTINGS and ca.get(k) != cb.get(k)}
    if "dtype" in differ:  # the dtype run says it; the one asked for (`auto`...) only where it alone differs
        differ.discard("dtype_requested")
    settings = [(k, ca.get(k), cb.get(k)) for k in sorted(differ)]
    texts = []
    for index, (ta, tb) in enumerate(zip(a.report["texts"], b.report["texts"])):
        single = batched = None
        if a.pack is not None and b.pack is not None:
            single = match_logits(a.pack.single.get(index), b.pack.single.get(index))
            batched = match_logits(a.pack.batched.get(index), b.pack.batched.get(index))
        texts.append(
            TextDiff(index, ta.get("line", index + 1), ta["text"], _outcome(ta), _outcome(tb), single, batched)
        )
    return RunDiff(environment, settings, texts)
