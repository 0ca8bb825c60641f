"""Every engine run's outcome, posted from its worker to whoever asked (the app, or a screen: a closed screen takes
none). The comparison, generation and served runs carry the number of the run they are of (a message of an older
run than the latest is stale and dropped); a failure nobody handles bubbles to the app, which says it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from ..core.endpoint.result import EndpointComparison
from ..core.numbers.comparison import Comparison
from ..core.numbers.generation_result import GenerationComparison
from ..core.settings import Settings


@dataclass
class RunProgress(Message):
    run_number: int
    label: str

    def can_replace(self, message: Message) -> bool:
        """A run's progress waiting behind a newer word of the same run is never drawn: the newer one is (a fast
        run posts many in a frame)."""
        return isinstance(message, RunProgress) and message.run_number == self.run_number


@dataclass
class ComparisonReady(Message):
    run_number: int
    comparison: Comparison


@dataclass
class RunFailed(Message):
    run_number: int
    message: str


@dataclass
class GenerationReady(Message):
    run_number: int
    result: GenerationComparison


@dataclass
class GenerationFailed(Message):
    """A generation run that failed; the comparison before it stands."""

    run_number: int
    message: str


@dataclass
class EndpointReady(Message):
    """A served model's continuations (`batchtui --url`), with the fault that cut the run short, if any."""

    run_number: int
    result: EndpointComparison


@dataclass
class EngineFailed(Message):
    """A run's failure in one line, for the app to say (a notification)."""

    message: str
    title: str = "failed"


@dataclass
class ModelLoaded(Message):
    """The model of `settings` loaded (a switch with M): it becomes the settings'."""

    settings: Settings


@dataclass
class ModelLoadFailed(Message):
    message: str


@dataclass
class PackWritten(Message):
    path: Path


@dataclass
class FingerprintReady(Message):
    summary: str


@dataclass
class SweepProgress(Message):
    """`done` of `total` cells measured, the last `cell` (None before the first)."""

    done: int
    total: int
    cell: object


@dataclass
class SweepDone(Message):
    cells: list


@dataclass
class RemediesMeasured(Message):
    outcomes: list


@dataclass
class KernelClassesFound(Message):
    found: object


@dataclass
class RolloutsProgress(Message):
    done: int
    total: int


@dataclass
class RolloutsScored(Message):
    summary: object


@dataclass
class TextsFileRead(Message):
    """A texts file's lines, read in a thread for the editor (ctrl+o)."""

    path: str
    lines: list[str]
