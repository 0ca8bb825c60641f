"""What `bench` gives back: the figures of one run, and the methods a layer above it adds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass
class BenchResult:
    model: str
    device: str
    dtype: str
    texts: int
    batch_size: int
    tokens: int
    vocab_size: int
    rounds: int
    tries: dict[str, int]  # timings per round of each method (three where it takes under a second)
    seconds: dict[str, float]  # each method's best round
    all_seconds: dict[str, list[float]]  # each round's best try
    peak_bytes: dict[str, int]
    # The generations' forward passes by phase (prefill, decode), seconds, in their best round's best try
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same in each round's best try (the phase ratios are medians of the rounds' ratios, as the others)
    all_phases: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # How the mode computed each kind of matmul: op, operand shape, dtype, path, height, each path's height
    matmul_paths: list[dict] = field(default_factory=list)
    # The aten ops whose CPU kernels the mode leaves to the library for this model (its calls never need them)
    library_kernels: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # of two methods: the median of their rounds' ratios
    spreads: dict[str, tuple[float, float]] = field(default_factory=dict)  # each ratio's least and greatest round
    targets: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MoreMethods:
    """Methods `bench` times beside its own (timed one after the other in their order), and the ratios of two of them
    with each one's limit: name -> (method, base, limit)."""

    methods: dict[str, Callable[[], None]]
    ratios: dict[str, tuple[str, str, float]]
