"""Messages the comparison and generation workers post to the app; each carries the run's generation number."""

from __future__ import annotations

from textual.message import Message

from ..core.comparison import Comparison
from ..core.generation_result import GenerationComparison


class RunProgress(Message):
    def __init__(self, generation: int, label: str) -> None:
        super().__init__()
        self.generation = generation
        self.label = label


class ComparisonReady(Message):
    def __init__(self, generation: int, comparison: Comparison) -> None:
        super().__init__()
        self.generation = generation
        self.comparison = comparison


class RunFailed(Message):
    def __init__(self, generation: int, message: str) -> None:
        super().__init__()
        self.generation = generation
        self.message = message


class GenerationReady(Message):
    def __init__(self, generation: int, result: GenerationComparison) -> None:
        super().__init__()
        self.generation = generation
        self.result = result


class GenerationFailed(Message):
    """A generation run that failed; the comparison before it stands."""

    def __init__(self, generation: int, message: str) -> None:
        super().__init__()
        self.generation = generation
        self.message = message
