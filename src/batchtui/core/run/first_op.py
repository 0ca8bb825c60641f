"""The first operation that makes a text's batched and single runs part (`check --ops`).

For a text that is not bitwise, its chunk is run batched and the text alone again, every aten operation inside its
first divergent module recorded (a dispatch mode, the module found by hooks). Each op's tensors are cut to this
text's part (its row, its real positions; a weight is whole), the two runs' ops are paired in execution order, and
the first op whose inputs for this text are bitwise equal and whose output is not is the one named: a difference that
arrives with an op's inputs is not that op's. Where no op inside that module parts so, the difference reached it from
a module the comparison does not record (a rotary embedding, a norm outside the layers): the whole pass is recorded
and searched the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..compat.torch import TorchDispatchMode, is_composite
from ..invariant.mode import invariant_if
from ..models.loading import LoadedModel
from ..numbers.comparison import FirstOp
from ..one_run import one_run_at_a_time
from ..settings import Settings
from .runner import Runner


@dataclass
class _Record:
    op: str
    module: str
    inputs: list[torch.Tensor | None]  # this text's part of each tensor input (None: not cut to the text)
    whole_inputs: list[object]  # the others: small ones copied, large ones (weights) by their storage
    output: torch.Tensor | None
    shapes: tuple[tuple[int, ...], ...]


class _Recorder(TorchDispatchMode):
    """Every aten op while `inside` names a module of the recorded subtree: its tensors, cut to the text."""

    def __init__(self, cut, in_parts: bool = False) -> None:
        super().__init__()
        self.cut = cut  # tensor -> this text's part, or None
        # An op made of others reaches this mode whole without autograd (a decode's), in its parts with it (a
        # trainer's): `in_parts` records its parts either way, so that two such runs pair op by op.
        self.in_parts = in_parts
        self.module: str | None = None
        self.records: list[_Record] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.in_parts and self.module is not None and is_composite(func):
            with self:  # (the mode is off inside its own call: on again for the parts)
                decomposed = func.decompose(*args, **(kwargs or {}))
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **(kwargs or {}))
        if self.module is not None:
            tensors = list(_tensors((args, kwargs or {})))
            output = next(_tensors(out), None)
            with torch.no_grad():  # (a composite op comes here above autograd: a trainer's forward records its cuts)
                parts = [self.cut(t) for t in tensors]  # each tensor cut (and copied) once
                self.records.append(
                    _Record(
                        op=f"aten.{func.__name__.split('.')[0]}",
                        module=self.module or "(the model's own forward)",
                        inputs=parts,
                        whole_inputs=[_whole(t) for t, part in zip(tensors, parts) if part is None],
                        output=None if output is None else self.cut(output),
                        shapes=tuple(tuple(t.shape) for t in tensors),
                    )
                )
        return out


def _tensors(value):
    """The tensors in an op's arguments or result (nested in lists, tuples and dicts), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


_SMALL = 1 << 16  # elements: an uncut input this small is copied and compared by value


def _whole(t: torch.Tensor) -> object:
    """An input that is not the text's (a weight, a table): by value where small, else by storage (the same
    parameter in both runs)."""
    return t.detach().clone() if t.numel() <= _SMALL else (t.data_ptr(), tuple(t.shape), tuple(t.stride()))


def _cutter(batch: int, length: int, row: int, real: torch.Tensor):
    """A tensor's part for one text of a [batch, length] call: [b, T, ...], [b·T, ...] or [b, h, T, (T), ...]."""

    def cut(t: torch.Tensor) -> torch.Tensor | None:
        s = t.shape
        where = real.to(t.device)
        if t.dim() >= 2 and s[0] == batch and s[1] == length:
            return t[row].index_select(0, where).detach().clone()
        if t.dim() >= 1 and s[0] == batch * length:
            return t.reshape(batch, length, *s[1:])[row].index_select(0, where).detach().clone()
        if t.dim() >= 3 and s[0] == batch and s[2] == length:
            part = t[row].index_select(1, where)
            if t.dim() >= 4 and s[3] == length:
                part = part.index_select(2, where)
            return part.detach().clone()
        return None

    return cut


def _recorded(
    loaded: LoadedModel, module: str, run, cut, only_pass: int | None = None, in_parts: bool = False
) -> list[_Record]:
    """The ops `run()` makes inside `module` (and its children; "": the whole model), each cut by `cut`; with
    `only_pass`, those of the
    model's pass of that number alone (counted from 0, as a decode's steps are); `in_parts`: see `_Recorder`."""
    recorder = _Recorder(cut, in_parts)
    stack: list[str] = []
    passes = [-1]

    def count(model, args):
        passes[0] += 1

    handles = [loaded.model.register_forward_pre_hook(count)] if only_pass is not None else []
    for name, sub in loaded.model.named_modules():
        if not module or name == module or name.startswith(module + "."):  # ("": every module)

            def enter(mod, args, name=name):
                stack.append(name)
                recorder.module = name if only_pass in (None, passes[0]) else None

            def leave(mod, args, output):
                stack.pop()
                recorder.module = stack[-1] if stack and only_pass in (None, passes[0]) else None

            handles += [sub.register_forward_pre_hook(enter), sub.register_forward_hook(leave)]
    try:
        with recorder:
            run()
    finally:
        for handle in handles:
            handle.remove()
    return recorder.records


def first_op(
    loaded: LoadedModel, settings: Settings, chunk_texts: list[str], row: int, token_ids: list[int], module: str
) -> FirstOp | None:
    """The first op inside `module` whose inputs for text `row` of the chunk equal its single run's and whose output
    does not; None where no op is found so (the difference arrives from outside what is recorded)."""
    runner = Runner(loaded, settings.padding_side, settings.positions, record=False, max_tokens=settings.max_tokens)
    n = len(token_ids)
    with torch.inference_mode(), invariant_if(settings.invariant, loaded.model, settings.kernel_classes):
        alone = _recorded(loaded, module, lambda: runner.single(token_ids), _cutter(1, n, 0, torch.arange(n)))
        _, mask = runner.padded(chunk_texts)
        real = mask[row].nonzero().flatten().cpu()
        cut = _cutter(mask.shape[0], mask.shape[1], row, real)
        batched = _recorded(loaded, module, lambda: runner.batched(chunk_texts), cut)
    return _first_parting(alone, batched)


@dataclass(frozen=True)
class OnePlace:
    """One run of the model and the place of one token in it: the pass (counted from 0, a decode's steps), the
    pass's batch and length, the token's row and position there (negative from the end)."""

    run: Callable[[], object]
    pass_: int
    batch: int
    length: int
    row: int
    position: int

    def recorded(self, loaded: LoadedModel, module: str) -> list[_Record]:
        position = self.position % self.length
        cut = _cutter(self.batch, self.length, self.row, torch.tensor([position]))
        last = position == self.length - 1

        def cut_or_last(t: torch.Tensor) -> torch.Tensor | None:
            part = cut(t)
            if part is None and last and t.dim() >= 2 and t.shape[0] == self.batch and self.length > 1:
                # the last position's alone in a longer pass: `generate`'s head computes the last logits only
                return t[self.row, -1:].detach().clone() if t.dim() >= 3 and t.shape[1] == 1 else t[self.row][None]
            return part

        # (a decode runs without autograd, a trainer with it: composite ops recorded in their parts)
        return _recorded(loaded, module, self.run, cut_or_last, self.pass_, in_parts=True)


def first_op_between(
    loaded: LoadedModel, module: str, first: OnePlace, second: OnePlace, sides: tuple[str, str]
) -> FirstOp | None:
    """The first op inside `module` whose inputs for one token are the same bits in two runs (at `first` and at
    `second`: a decode step and a trainer's forward, say) and whose output is not; None where none is. `sides` names
    the two runs in the op's words."""
    parted = _first_parting(first.recorded(loaded, module), second.recorded(loaded, module))
    return None if parted is None else replace(parted, sides=sides)


def _first_parting(alone: list[_Record], batched: list[_Record]) -> FirstOp | None:
    keys = [(r.op, r.module) for r in alone], [(r.op, r.module) for r in batched]
    matcher = difflib.SequenceMatcher(a=keys[0], b=keys[1], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            a, b = alone[block.a + k], batched[block.b + k]
            if a.output is None or b.output is None or a.output.shape != b.output.shape:
                continue
            if not _same_inputs(a, b) or torch.equal(a.output, b.output):
                continue
            delta = (a.output.double() - b.output.double()).abs().amax().item() if a.output.is_floating_point() else 0
            return FirstOp(a.op, a.module, a.shapes, b.shapes, float(delta))
    return None


def _same_inputs(a: _Record, b: _Record) -> bool:
    """Every input cut to the text is bitwise the same in both runs, and so is every uncut one (weights), paired in
    order; inputs only one run has (the mask a padded batch's attention takes, absent alone) are the op's setup."""
    for x, y in zip(a.inputs, b.inputs):
        if (x is None) != (y is None) or (x is not None and y is not None and not _same_values(x, y)):
            return False
    return all(_same(x, y) for x, y in zip(a.whole_inputs, b.whole_inputs))


def _same_values(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise equal; grouped key/value heads count as their repeats (SDPA takes them grouped alone, repeated in a
    masked batch: [kv heads, n, d] against [heads, n, d])."""
    if x.shape != y.shape and x.dim() == y.dim() >= 1 and x.shape[1:] == y.shape[1:]:
        small, large = (x, y) if x.shape[0] < y.shape[0] else (y, x)
        if small.shape[0] and large.shape[0] % small.shape[0] == 0:
            return torch.equal(small.repeat_interleave(large.shape[0] // small.shape[0], dim=0), large)
    return x.shape == y.shape and torch.equal(x, y)


def _same(x, y) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
    return x == y


@one_run_at_a_time()
def with_first_ops(comparison, texts: list[str], settings: Settings):
    """`comparison` with each text's first op (`TextResult.first_op`) found, where it is not bitwise."""
    from ..models.loading import load_model

    loaded = load_model(settings)
    size = settings.batch_size
    found = []
    for index, result in enumerate(comparison.texts):
        op = None
        if not result.bitwise_equal:
            start = index - index % size
            where = result.first_divergent_module
            module = where.name if where is not None and where.name in dict(loaded.model.named_modules()) else ""
            chunk, row, ids = list(texts[start : start + size]), index - start, list(result.token_ids)
            op = first_op(loaded, settings, chunk, row, ids, module)
            if op is None and module:
                # No op inside the module parts on equal inputs: what parts reached it from a module the comparison
                # does not record (a rotary embedding, a norm outside the layers): the whole pass, op by op.
                op = first_op(loaded, settings, chunk, row, ids, "")
        found.append(replace(result, first_op=op))
    return replace(comparison, texts=tuple(found))
