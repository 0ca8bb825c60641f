"""A repro pack's two journeys: made from a run (the texts compared keeping both runs' logits, then written:
`reports.pack_writer`), and replayed on this machine (`check --from`: the pack's command run again, each text's
logits alone and batched set against the pack's, the environments' differences); the command only prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..numbers.comparison import Comparison, RunResult
from ..numbers.logits_match import LogitsMatch, match_logits
from ..one_run import one_run_at_a_time
from ..reports.pack_reader import DEFAULT_LOGITS_MB, ChosenModel, Pack
from ..reports.pack_writer import KeptLogits, check_command, write_pack
from ..settings import Settings
from ..texts import NumberedTexts


class PackInTheMaking:
    """A pack being made: the logits of the run it keeps (its `sink`, handed to that run: the baseline's, where a
    command measures remedies too), at most `max_mb` of them, then the pack written (`write`) from that run's report.
    `check --repro` and the app's pack both make theirs so."""

    def __init__(self, path: Path, max_mb: float = DEFAULT_LOGITS_MB) -> None:
        self.path = path
        self.sink = KeptLogits(int(max_mb * 2**20))

    def write(self, report: dict, numbered: NumberedTexts, command: list[str], settings: Settings) -> None:
        write_pack(self.path, report, numbered.texts, numbered.lines, command, settings, self.sink)


@one_run_at_a_time()  # the kept logits are written as tensors: still the run's
def make_pack(path: Path, numbered: NumberedTexts, settings: Settings, progress=None, cancelled=None) -> Comparison:
    """Compare the texts under `settings` (the job `check` runs) keeping both runs' logits, and write the pack to
    `path` (checked new) with the `check` command that runs it again."""
    from ..reports.report import to_json_dict
    from .comparison_job import ComparisonJob

    pack = PackInTheMaking(path)
    result = ComparisonJob(numbered, settings).run(progress, cancelled, logits_sink=pack.sink)
    pack.write(to_json_dict(result), numbered, check_command(settings), settings)
    return result


@dataclass(frozen=True)
class TextReplayed:
    index: int
    line: int
    text: str
    single: LogitsMatch | None  # its logits alone here against the pack's (None: the pack kept none)
    batched: LogitsMatch | None

    @property
    def compared(self) -> bool:
        return self.single is not None and self.batched is not None

    @property
    def reproduced(self) -> bool:
        """Both its logits the pack's, bit for bit."""
        return (
            self.single is not None
            and self.batched is not None
            and self.single.bitwise_equal
            and (self.batched.bitwise_equal)
        )


@dataclass(frozen=True)
class PackReplay:
    """What running a pack again here found."""

    result: RunResult  # the run here
    environment: dict  # here's
    changed: list[tuple]  # (field, the pack's, here's) of every difference
    texts: list[TextReplayed]

    @property
    def compared(self) -> int:
        return sum(t.compared for t in self.texts)

    @property
    def reproduced(self) -> int:
        return sum(t.reproduced for t in self.texts)


def replay_pack(pack: Pack, chosen: ChosenModel, progress=None) -> PackReplay:
    """Run `pack`'s command again here on the chosen model, keeping the logits, and set them against the pack's."""
    from ..reports.environment import differences
    from ..reports.report import run_environment

    kept = KeptLogits(cap_bytes=2**62)
    config = pack.report.get("config", {})
    result: RunResult
    if pack.is_generation:
        from .generation_run import generate_and_compare

        result = generate_and_compare(
            pack.texts, chosen.settings, config.get("max_new_tokens", 32), bool(config.get("from_embeds")),
            progress=progress, lines=pack.lines, logits_sink=kept,
        )  # fmt: skip
    else:
        from .engine import compare

        result = compare(pack.texts, chosen.settings, progress=progress, lines=pack.lines, logits_sink=kept)
    here = run_environment(result.config, pack.texts)
    changed = differences(pack.report.get("environment", {}), here, ignore=("fingerprint", "identity.folder"))
    texts = [
        TextReplayed(
            index,
            line,
            text,
            match_logits(kept.single.get(index), pack.single.get(index)),
            match_logits(kept.batched.get(index), pack.batched.get(index)),
        )  # fmt: skip
        for index, (line, text) in enumerate(zip(pack.lines, pack.texts))
    ]
    return PackReplay(result, here, changed, texts)
