"""The result of a comparison: plain dataclasses, the one thing the CLI, the TUI and JSON render."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, NamedTuple


class TopToken(NamedTuple):
    """One of a run's top-k tokens at a position."""

    id: int
    token: str
    logit: float
    prob: float
    prob_in_other: float  # this token's probability in the other run
    # This token's 0-based rank among the other run's top-k at the same position, None if absent.
    rank_in_other: int | None


@dataclass(frozen=True)
class FirstOp:
    op: str  # e.g. "aten.mm"
    module: str  # the innermost module it ran in
    shape_single: tuple[tuple[int, ...], ...]  # its tensor inputs' shapes alone
    shape_batched: tuple[tuple[int, ...], ...]  # ... and in the batch
    max_abs_diff: float  # of its output for this text
    # The two runs in words: the text alone and batched (`check --ops`), or a sampler and a trainer
    sides: tuple[str, str] = ("alone", "batched")

    def words(self) -> str:
        first, second = self.sides
        shapes = f"{_shapes(self.shape_single)} {first}, {_shapes(self.shape_batched)} {second}"
        return f"{self.op} in {self.module}: {shapes}"

    @property
    def kernel_class(self) -> str:
        """The invariant mode's class that removes a difference from this op (`settings.KERNEL_CLASSES`)."""
        name = self.op.removeprefix("aten.")
        if name in _MATMULS:
            return "matmul"
        if "attention" in name:
            return "attention"
        if name in _REDUCTIONS:
            return "reduction"
        return "elementwise"

    def cause(self) -> str:
        """What was measured of this op (the calls' sizes; the same inputs for the text, other output bits), then a
        likely reason by its kernel class, worded as likely: the tool sees shapes and bits, not the kernel's code."""
        kind, (first, second) = self.kernel_class, self.sides
        if kind == "matmul":
            operand = 1 if self.op.removeprefix("aten.") in _BIAS_FIRST else 0  # the rows, after a bias
            alone, batched = (
                _rows(shapes[operand]) if len(shapes) > operand else 0
                for shapes in (self.shape_single, self.shape_batched)
            )
            return (
                f"a {alone}-row call {first}, {batched} rows {second}: likely the GEMM library blocking (or "
                "summing) them differently"
            )
        if kind == "attention":
            alone, batched = (
                shapes[1][-2] if len(shapes) > 1 else 0 for shapes in (self.shape_single, self.shape_batched)
            )
            return (
                f"attention over {alone} keys {first}, {batched} {second} (padding included): likely another kernel "
                "or another reduction order"
            )
        measured = f"the same inputs for this text {first} and {second}, other output bits"
        if kind == "reduction":
            return f"{measured}: likely a reduction along each row split by the call's shape"
        if self.shape_single != self.shape_batched:
            return f"{measured}: likely the op's vector tail or its threads' split falling elsewhere in the larger call"
        return f"{measured} in calls of the same shape: the op's own kernel, not the call's size, differs"


_MATMULS = frozenset({"linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "_grouped_mm", "addmv", "mv"})
_BIAS_FIRST = frozenset({"addmm", "baddbmm", "addmv"})
_REDUCTIONS = frozenset(
    {"mean", "sum", "var", "var_mean", "norm", "linalg_vector_norm", "amax", "_softmax", "softmax", "log_softmax"}
    | {"_log_softmax", "native_layer_norm", "layer_norm", "rms_norm", "cumsum"}
)


def _rows(shape: tuple[int, ...]) -> int:
    """How many rows a matmul's first input holds: every dimension but its last."""
    rows = 1
    for size in shape[:-1]:
        rows *= size
    return rows


def _shapes(shapes) -> str:
    return " @ ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)


@dataclass(frozen=True)
class PositionMetrics:
    """Batched vs single logits of one text at one token position (all in float32)."""

    index: int
    token_id: int
    token: str
    max_abs_diff: float
    mean_abs_diff: float
    kl: float  # KL(softmax single || softmax batched)
    top1_flip: bool
    margin: float  # top-1 minus top-2 logit of the single run
    allclose: bool  # torch.isclose(batched, single, atol, rtol) at every vocabulary entry
    max_abs_diff_ulp: float  # max|Δ| in units of the dtype's spacing at the position's largest |logit|
    topk_batch: tuple[TopToken, ...]
    topk_single: tuple[TopToken, ...]

    @property
    def margin_ulp(self) -> float | None:
        """The margin in units of the dtype's spacing at the position's largest |logit| (None where max|Δ|
        is 0 and the spacing is not known from it)."""
        if self.max_abs_diff > 0 and self.max_abs_diff_ulp > 0:
            return self.margin / (self.max_abs_diff / self.max_abs_diff_ulp)
        return None

    @property
    def near_tie(self) -> bool:
        """The single run's top-1 margin is within 2·max|Δ|: rounding-sized differences are enough to
        change the choice (a flip here is a near-tie, not a large change of the logits)."""
        return self.margin <= 2 * self.max_abs_diff


@dataclass(frozen=True)
class ModuleMetrics:
    """Hidden-state divergence after one module (embeddings, a decoder layer, a sub-module, the final
    norm) or of the logits themselves (the last entry, so no divergence goes unplaced)."""

    index: int
    name: str  # the module's real dotted name ("model.layers.3.mlp", "transformer.ln_f"), or "logits"
    max_abs_diff: float
    rel_l2: float  # ||hB - hS|| / ||hS|| over the text's real positions
    bitwise_equal: bool
    kind: str = "layer"  # "embedding", "layer", "sub" (inside a layer), "final", "logits"
    role: str | None = None  # "attention", "MLP", "norm", "router" where the module says so


@dataclass(frozen=True)
class RoutingChange:
    """A token whose MoE router chose other experts in the batched run than in the single run."""

    position: int
    layer: int  # the decoder layer's index
    router: str  # the router's dotted name
    experts_batched: tuple[int, ...]
    experts_single: tuple[int, ...]


@dataclass(frozen=True)
class Decomposition:
    """The padded-row run P (row i of the padded batch, run as a batch of one) splits B vs S."""

    batch_effect: float  # max|B - P|: same padding, batch of one vs the whole chunk
    padding_effect: float  # max|P - S|: padded and masked vs no padding at all
    batch_effect_allclose: bool
    padding_effect_allclose: bool


@dataclass(frozen=True)
class ReferenceErrors:
    """Each run against R, the text alone in float64 on the CPU: is batching worse or only different?"""

    batched: float  # max|B - R|
    single: float  # max|S - R|


class DeferredColumns:
    """Columns converted to Python on their first read: rows [start, stop) of a group's [N, k] host arrays (anything
    with `tolist`). A text's top-k columns (eight tuples per position) cost more to convert than all its other
    numbers, and a check that reads only per-text figures, or a view of one position, never needs them all."""

    __slots__ = ("arrays", "start", "stop")

    def __init__(self, arrays: Mapping[str, Any], start: int, stop: int) -> None:  # numpy arrays
        self.arrays, self.start, self.stop = arrays, start, stop

    def converted(self) -> dict[str, tuple]:
        return {name: tuple(map(tuple, array[self.start : self.stop].tolist())) for name, array in self.arrays.items()}


@dataclass(frozen=True)
class PositionColumns:
    """A text's per-position numbers as columns, one entry per token, as the engine measured them: the one
    declaration of the per-position schema (the metrics fill these names; rows, views and JSON read them).

    `PositionMetrics` rows are built from them on first use: a CI check needs only per-text
    figures, and building thousands of row objects per text would cost more than the metrics.
    """

    token_ids: tuple[int, ...]
    max_abs_diff: tuple[float, ...]
    max_abs_diff_ulp: tuple[float, ...]
    mean_abs_diff: tuple[float, ...]
    kl: tuple[float, ...]
    top1_flip: tuple[bool, ...]
    margin: tuple[float, ...]
    allclose: tuple[bool, ...]
    topk_batch_ids: tuple[tuple[int, ...], ...]
    topk_batch_logits: tuple[tuple[float, ...], ...]
    topk_batch_probs: tuple[tuple[float, ...], ...]
    topk_batch_probs_in_single: tuple[tuple[float, ...], ...]
    topk_single_ids: tuple[tuple[int, ...], ...]
    topk_single_logits: tuple[tuple[float, ...], ...]
    topk_single_probs: tuple[tuple[float, ...], ...]
    topk_single_probs_in_batch: tuple[tuple[float, ...], ...]
    token_texts: Mapping[int, str] = field(compare=False, repr=False)  # every id above, decoded

    @classmethod
    def measured(cls) -> tuple[str, ...]:
        """The names of the measured columns (all but the tokens), as `metrics.PositionStats` names them."""
        return tuple(f.name for f in fields(cls) if f.name not in ("token_ids", "token_texts"))

    @classmethod
    def deferring(cls, deferred: DeferredColumns, **columns) -> PositionColumns:
        """The columns given here, and `deferred`'s converted on their first read (any of them converts all)."""
        missing = {f.name for f in fields(cls)} - columns.keys() - deferred.arrays.keys()
        if missing:
            raise TypeError(f"columns missing: {sorted(missing)}")
        made = object.__new__(cls)
        for name, value in columns.items():
            object.__setattr__(made, name, value)
        object.__setattr__(made, "_deferred", deferred)
        return made

    def __getattr__(self, name: str):
        # Only asked for an attribute not set: a deferred column, converted with the others on its first read.
        deferred = self.__dict__.get("_deferred")
        if deferred is None or name not in deferred.arrays:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        for column, values in deferred.converted().items():
            object.__setattr__(self, column, values)
        del self.__dict__["_deferred"]  # the group's arrays are no longer held for this text
        return self.__dict__[name]

    def rows(self) -> tuple[PositionMetrics, ...]:
        return tuple(self.row(t) for t in range(len(self.token_ids)))

    def row(self, t: int) -> PositionMetrics:
        """Position t's numbers as one row, built without the others'."""
        return PositionMetrics(
            index=t,
            token_id=self.token_ids[t],
            token=self.token_texts[self.token_ids[t]],
            max_abs_diff=self.max_abs_diff[t],
            max_abs_diff_ulp=self.max_abs_diff_ulp[t],
            mean_abs_diff=self.mean_abs_diff[t],
            kl=self.kl[t],
            top1_flip=self.top1_flip[t],
            margin=self.margin[t],
            allclose=self.allclose[t],
            topk_batch=self._top(
                self.topk_batch_ids[t],
                self.topk_single_ids[t],
                self.topk_batch_logits[t],
                self.topk_batch_probs[t],
                self.topk_batch_probs_in_single[t],
            ),
            topk_single=self._top(
                self.topk_single_ids[t],
                self.topk_batch_ids[t],
                self.topk_single_logits[t],
                self.topk_single_probs[t],
                self.topk_single_probs_in_batch[t],
            ),
        )

    def _top(self, ids, other_ids, logits, probs, probs_in_other) -> tuple[TopToken, ...]:
        rank_in_other = {token_id: rank for rank, token_id in enumerate(other_ids)}
        return tuple(
            TopToken(i, self.token_texts[i], logit, prob, in_other, rank_in_other.get(i))
            for i, logit, prob, in_other in zip(ids, logits, probs, probs_in_other)
        )


@dataclass(frozen=True)
class TextResult:
    index: int
    text: str
    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]
    allclose: bool  # exactly torch.allclose(B_i, S_i, atol, rtol) on the model's logits
    max_abs_diff: float
    kl_max: float
    top1_flips: int
    worst_position: int
    max_abs_diff_ulp: float
    columns: PositionColumns
    layers: tuple[ModuleMetrics, ...]
    truncated: bool = False  # the text was longer than max_tokens and was cut to it
    # Per-module hidden states (settings.modules): norms, attention, MLP and residual of each layer.
    modules: tuple[ModuleMetrics, ...] = ()
    decomposition: Decomposition | None = None
    reference: ReferenceErrors | None = None
    routing_changes: tuple[RoutingChange, ...] = ()  # MoE: tokens routed to other experts in B than in S
    first_op: FirstOp | None = None  # `--ops`: the first aten op that makes the runs part, inside the first module
    line: int = 0  # the line the text came from (texts file, editor, argument position); 1-based
    padding: int = 0  # pad tokens this text had in its batch (0: the longest of its batch)

    @cached_property
    def positions(self) -> tuple[PositionMetrics, ...]:
        return self.columns.rows()

    def position(self, t: int) -> PositionMetrics:
        """Position t's row, without building the text's others (a view shows one position at a time)."""
        return self.columns.row(t)

    @property
    def first_divergent_layer(self) -> ModuleMetrics | None:
        return next((layer for layer in self.layers if not layer.bitwise_equal), None)

    @property
    def first_divergent_module(self) -> ModuleMetrics | None:
        return next((module for module in self.modules if not module.bitwise_equal), None)

    @property
    def bitwise_equal(self) -> bool:
        """The batched logits are the single run's, bit for bit (the batch-invariant mode's promise)."""
        return self.max_abs_diff == 0

    @property
    def where_it_parts(self) -> str:
        """Where the batched and single runs first part, in words: the first module that is not bitwise equal."""
        first = self.first_divergent_module or self.first_divergent_layer
        return f"first at {first.name}" if first is not None else "at the logits"


@dataclass(frozen=True)
class Summary:
    texts: int
    diverged: int
    max_abs_diff: float
    top1_flips: int


@dataclass(frozen=True)
class RunResult:
    """What every run returns: the settings it resolved to, one result per text, what it noticed, its time."""

    config: dict
    texts: tuple
    notes: tuple[str, ...] = field(default=())
    elapsed_s: float = 0.0

    @property
    def max_abs_diff(self) -> float:
        """The largest max|Δ| of any text."""
        return max((t.max_abs_diff for t in self.texts), default=0.0)


@dataclass(frozen=True)
class Comparison(RunResult):
    """Everything one `compare()` call measured, with the settings it resolved to."""

    texts: tuple[TextResult, ...]

    @property
    def summary(self) -> Summary:
        diverged = sum(not t.allclose for t in self.texts)
        return Summary(len(self.texts), diverged, self.max_abs_diff, sum(t.top1_flips for t in self.texts))

    @property
    def all_close(self) -> bool:
        return all(t.allclose for t in self.texts)
