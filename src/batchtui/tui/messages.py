"""Messages the comparison and generation workers post to the app; each carries the number of the run it is of
(a message of an older run than the latest is stale and dropped)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from ..core.endpoint.result import EndpointComparison
from ..core.numbers.comparison import Comparison
from ..core.numbers.generation import GenerationComparison


@dataclass
class RunProgress(Message):
    run_number: int
    label: str


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
