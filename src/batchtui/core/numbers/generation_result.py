"""What `generate_and_compare()` measured: each text's two greedy continuations and where they part."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .comparison import FirstOp, PositionColumns, PositionMetrics, RunResult
from .importance import ImportanceMetrics, SequenceLogprobs, importance_metrics
from .trl_parts import TrlParts

DEFAULT_MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class Continuation:
    """The new tokens one run chose, up to and including the first end-of-sequence token."""

    token_ids: tuple[int, ...]
    text: str
    ended_at_eos: bool


@dataclass(frozen=True)
class DecodeVsPrefill:
    """The text alone: each decode step's next-token logits (with the KV cache) against one forward of the whole
    sequence so far (a prefill), per step max|Δ| in float32."""

    max_abs_diff: tuple[float, ...]
    # At the first step that differs: the first module, in run order, whose output for the step's position is
    # not bitwise the same with the cache (one new token after the earlier ones' keys and values) and in the
    # prefill. None where no step differs.
    first_module: str | None = None

    @property
    def first_differing_step(self) -> int | None:
        return next((step for step, d in enumerate(self.max_abs_diff) if d != 0), None)

    @property
    def bitwise(self) -> bool:
        return self.first_differing_step is None


@dataclass(frozen=True)
class TextGeneration:
    index: int
    line: int  # the line the text came from, as in `TextResult.line`
    text: str
    prompt_tokens: int
    truncated: bool
    single: Continuation  # the text alone: batch of one, no padding
    batched: Continuation  # the text's row of its left-padded chunk
    # The first step (0 = the first new token) where the two runs chose different tokens; None if none.
    split_step: int | None
    # Per step up to the split (inclusive), the two runs' next-token logits compared like positions: the
    # prefixes are the same there. After the split the runs read different prefixes: not comparable.
    steps: PositionColumns
    vs_prefill: DecodeVsPrefill | None = None  # with `--vs-prefill`
    # With `--vs-trainer`: the batched run's new tokens as the sampler gave them (decoded in the batch) and as the
    # trainer scores them (one training-mode forward of the chunk's prompt + completion, `run.trainer_forward`).
    vs_trainer: SequenceLogprobs | None = None
    # There, at its first differing token, the first module (in run order) whose output is not the same bits in the
    # batched decode and in the trainer's forward; None where they do not part.
    vs_trainer_module: str | None = None
    # With `--ops` too: inside that module, the first op whose inputs for the token are the same in the two and whose
    # output is not; None where not asked or none is found.
    vs_trainer_op: FirstOp | None = None

    @property
    def differs(self) -> bool:
        return self.split_step is not None

    @cached_property
    def step_metrics(self) -> tuple[PositionMetrics, ...]:
        return self.steps.rows()

    @property
    def split(self) -> PositionMetrics | None:
        """The split step's numbers and both runs' top-k."""
        return None if self.split_step is None else self.step_metrics[self.split_step]

    @property
    def near_tie(self) -> bool | None:
        """At the split, the single run's top-1 margin was within 2·max|Δ|: rounding-sized differences
        were enough to change the choice. None without a split."""
        split = self.split
        return None if split is None else split.near_tie

    @property
    def max_abs_diff(self) -> float:
        """The largest next-token max|Δ| over the comparable steps (up to the split)."""
        return max(self.steps.max_abs_diff, default=0.0)

    @property
    def bitwise_equal(self) -> bool:
        """Same tokens, and every step's logits the same bits (the batch-invariant mode's promise)."""
        return not self.differs and self.max_abs_diff == 0

    @property
    def where_it_parts(self) -> str:
        """The first step whose logits differ, and the split if the tokens part."""
        first = next((i for i, d in enumerate(self.steps.max_abs_diff) if d != 0), None)
        words = [] if first is None else [f"first at step {first}"]
        if self.differs:
            words.append(f"splits at step {self.split_step}")
        return ", ".join(words)


@dataclass(frozen=True)
class GenerationSummary:
    texts: int
    differ: int  # continuations that differ
    near_ties: int  # of those, splits at a near-tie
    max_abs_diff: float


@dataclass(frozen=True)
class GenerationComparison(RunResult):
    """Every text's continuations batched and alone, with the settings the run resolved to."""

    texts: tuple[TextGeneration, ...]
    trl_parts: TrlParts | None = None  # with `--trainer trl`: which of TRL's ways moves the trainer's logprobs

    @property
    def trainer_vs_sampler(self) -> ImportanceMetrics | None:
        """Over every text's tokens, with `--vs-trainer`; None without."""
        measured = [t.vs_trainer for t in self.texts if t.vs_trainer is not None]
        return importance_metrics(measured) if measured else None

    @property
    def summary(self) -> GenerationSummary:
        near_ties = sum(bool(t.near_tie) for t in self.texts)
        return GenerationSummary(len(self.texts), sum(t.differs for t in self.texts), near_ties, self.max_abs_diff)
