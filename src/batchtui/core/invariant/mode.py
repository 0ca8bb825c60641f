"""`batch_invariant(model)`: the same logits for a text alone and inside any padded batch, bitwise.

    with batch_invariant(model):
        batched = model(inputs_embeds=..., attention_mask=..., position_ids=...).logits
        ...  # each text's real rows torch.equal its logits run alone; model.generate(...) too

Four sources make a row's logits depend on the rest of the batch, and the mode removes each for the duration:
matmuls whose kernel depends on the call's height (`invariant.matmul`, and a model's linear layers at the layer:
`invariant.linear`), reductions over a row (a norm's mean)
whose thread configuration depends on how many rows there are (`invariant.reduction`), attention over padded keys
(`invariant.attention`) and element-wise functions whose vector tails round otherwise (`invariant.elementwise`, and
a model's activation modules at the module).
The CPU kernels a model's passes never call in a way a batch changes (a norm's mean, a float32 rsqrt: found from
its own calls, `invariant.census`) stay the library's for it: a call of them does not cross into Python.
On the way out, even on an exception or Ctrl+C, the aten kernels, the attention interfaces, the model's
attention implementation and the thread's function modes are what they were.
Another thread's passes meanwhile keep the library's kernels and the model's own attention. Only the entry and
the exit themselves race with it: they register and remove aten kernels process-wide, and PyTorch dispatches a
call without a lock, so no other thread should run torch calls at those moments (the engine's runs take turns:
`core.one_run`).

It refuses (`NotInvariant`, with a one-line reason) a model it cannot cover: attention computed outside
transformers' attention interface with another kernel than SDPA, or layers that mix tokens without attention or
beside it (recurrent, convolution or state-space mixers: a probe with every query attending only itself finds
them). Anything else it cannot see, the caller's own comparison shows.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

from ..compat.transformers import attn_implementation, supports_sdpa, takes_attention_interface
from ..errors import NotInvariant
from ..models.structure import layer_count
from ..numbers.logit_rows import rows_differ
from ..settings import KERNEL_CLASSES
from .attention import (
    InOrderSdpa,
    attend_in_order,
    attention_calls,
    direct_sdpa_calls,
    each_query_attending_itself,
)
from .census import needless_cpu_kernels
from .elementwise import TailFreeActivations, TailFreeElementwise
from .fused_heads import FusedHeadsAsSampled
from .linear import RowInvariantLinears, forget_layer_paths
from .matmul import RowInvariantMatmuls
from .measured_store import registered_kernels, store
from .measuring import finished as measuring_finished
from .positions import PositionsFromMask
from .randomness import RandomnessRefused
from .reduction import RowInvariantReductions
from .routing import NAME, AttentionRouting, inner_implementation
from .rows import forget_measured

# The aten kernels the mode replaces while entered (and `outside_the_mode` pauses), by the class each makes
# batch-independent; the fourth class, attention, is the model's routing to `attend_in_order`.
_KERNEL_SCOPES = {
    "matmul": RowInvariantMatmuls,
    "reduction": RowInvariantReductions,
    "elementwise": TailFreeElementwise,
}

# model -> (what it was probed as: its attention implementation, dtype, the CPU's autocast and its modules; why the
# mode cannot cover it or None; whether it calls SDPA itself; the CPU kernels its passes never need replaced), found
# once per model and what it was probed as
_gaps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# The modules the mode computes in a forward of its own (a census finds the calls of every other)
_AT_MODULES = (RowInvariantLinears, TailFreeActivations)


@contextlib.contextmanager
def batch_invariant(model, classes: tuple[str, ...] = KERNEL_CLASSES) -> Iterator[None]:
    """Run `model` batch-invariantly inside the block; `NotInvariant` if it cannot be (see the module doc).
    `classes`: which of the mode's parts to apply (`KERNEL_CLASSES`, all by default), to find which one a
    difference comes from."""
    if store.use_kernels(registered_kernels()):  # a kernel registered since the last entry: measured anew
        forget_measured()
        forget_layer_paths()
    modules = list(model.modules())  # walked once an entry: the probe's key, the layers' forwards, the configs
    _, gap, calls_sdpa, needless = _probed(model, modules)
    if gap is not None:
        raise NotInvariant(gap)
    try:
        with (
            _mode(model, catch_sdpa=calls_sdpa, classes=classes, library_on_cpu=needless, modules=modules),
            PositionsFromMask(model),  # a row's positions must not depend on its batch either
            FusedHeadsAsSampled(model),  # nor a trainer's logprob on how its head is fused
            RandomnessRefused(model),  # nor its logits on a draw
        ):
            yield
    finally:
        store.flush()  # what this block measured, for the next process
        measuring_finished()


@contextlib.contextmanager
def outside_the_mode() -> Iterator[None]:
    """The library's own kernels for this thread inside the block, within `batch_invariant` too: the mode is for
    the model's passes; measuring them (the metrics) takes the same kernels in and out of the mode, and no tiles."""
    with contextlib.ExitStack() as stack:
        for scope in _KERNEL_SCOPES.values():
            stack.enter_context(scope.paused())
        yield


def invariant_if(on: bool, model, classes: tuple[str, ...] = KERNEL_CLASSES) -> contextlib.AbstractContextManager:
    """`batch_invariant(model, classes)` when `on`, else a context that changes nothing."""
    return batch_invariant(model, classes) if on else contextlib.nullcontext()


def coverage_gap(model) -> str | None:
    """Why the mode cannot make `model` batch-invariant, in one line; None when it covers it."""
    return _probed(model)[1]


def library_kernels_on_cpu(model) -> frozenset[str]:
    """The aten ops the mode leaves to the library on the CPU for `model`: its passes never call them in a way
    the replacement would change (`invariant.census`)."""
    return _probed(model)[3]


def _probed(model, modules: list | None = None) -> tuple[tuple, str | None, bool, frozenset[str]]:
    """(what the model was probed as, coverage gap, whether it calls SDPA itself, the CPU kernels it never needs
    replaced), for the attention, dtype, CPU autocast and modules (`modules`, where walked already) the model has
    now."""
    dtype = getattr(model, "dtype", None)
    modules = list(model.modules()) if modules is None else modules
    probed_as = (_implementation(model), dtype, *_cpu_autocast(), _computed_where(modules))
    known = _gaps.get(model)
    if known is None or known[0] != probed_as:
        gap, calls_sdpa = _static_gap(model), True
        if gap is None:
            gap, calls_sdpa = _probed_gap(model)
        needless: frozenset[str] = frozenset()
        if gap is None and any(p.is_cpu for p in model.parameters()):
            scopes = [scope() for scope in _KERNEL_SCOPES.values()]
            needless = needless_cpu_kernels(model, scopes, [forwards(model) for forwards in _AT_MODULES])
        known = _gaps[model] = (probed_as, gap, calls_sdpa, needless)
    return known


def _computed_where(modules: list) -> tuple:
    """Each of a model's modules, by identity and class, and whether the mode computes it itself: what the probe
    and census found holds for these (a layer weight-normed or an activation swapped since makes calls they never
    saw, perhaps of a kernel left to the library)."""
    return tuple(map(id, modules)), tuple(map(type, modules)), *(tuple(map(at.covers, modules)) for at in _AT_MODULES)


def _cpu_autocast() -> tuple[bool, torch.dtype]:
    """Whether autocast is on for the CPU, and its dtype (the calls a census sees depend on them)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch 2.4 and later; the CPU-only forms warn there
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()


def _implementation(model) -> str:
    """The model's own attention implementation, also inside a block (where it is routed to the mode's)."""
    current = str(attn_implementation(model.config) or "eager")
    return (inner_implementation(model.config) or current) if current == NAME else current


def _static_gap(model) -> str | None:
    implementation = _implementation(model)
    name = type(model).__name__
    # SDPA calls are caught wherever they are made; other attention only through transformers' interface
    if not takes_attention_interface(model) and implementation != "sdpa":
        hint = " (run it with --attn sdpa)" if supports_sdpa(model) else ""
        return (
            f"{name} computes its {implementation} attention itself, outside transformers' attention interface: "
            f"not covered{hint}"
        )
    return None


def _probed_gap(model) -> tuple[str | None, bool]:
    """A short pass in the mode: every layer must attend through it, or some layer mixes tokens otherwise. With
    the gap, whether the model called SDPA itself in it (outside the attention interface)."""
    layers = layer_count(model.config)
    embeddings = model.get_input_embeddings()
    vocab = embeddings.weight.shape[0]
    ids = torch.arange(1, 5, device=embeddings.weight.device).remainder(vocab)[None]
    before, direct_before = attention_calls(), direct_sdpa_calls()
    try:
        with _mode(model, catch_sdpa=True), torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    except NotInvariant as exc:
        return str(exc), True
    attended = attention_calls() - before
    calls_sdpa = direct_sdpa_calls() > direct_before
    if layers is not None and attended < layers:
        return (
            f"{layers - attended} of {layers} layers of {type(model).__name__} mix tokens without attention "
            "(recurrent or convolution layers): not covered"
        ), calls_sdpa
    if _mixes_beside_attention(model, ids, vocab):
        return (
            f"{type(model).__name__} mixes tokens beside its attention (a recurrent, convolution or state-space "
            "mixer in its layers): not covered"
        ), calls_sdpa
    return None, calls_sdpa


def _mixes_beside_attention(model, ids: torch.Tensor, vocab: int) -> bool:
    """Whether the last position's logits still depend on the first token when every query attends only its own
    key: some other part of a layer (Falcon-H1's Mamba beside its attention, a convolution) carries it across."""
    other = ids.clone()
    other[0, 0] = (ids[0, 0] + 1) % vocab
    mask = torch.ones_like(ids)
    with _mode(model, catch_sdpa=True), each_query_attending_itself(), torch.inference_mode():
        first = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[0, -1]
        changed = model(input_ids=other, attention_mask=mask, use_cache=False).logits[0, -1]
    # bit for bit, so NaN for the same NaN (a weight-normed head over a zero row gives some), which `torch.equal`
    # would take for a change
    return bool(rows_differ(first[None], changed[None]).item())


@contextlib.contextmanager
def _mode(
    model,
    catch_sdpa: bool,
    classes: tuple[str, ...] = KERNEL_CLASSES,
    library_on_cpu: frozenset[str] = frozenset(),
    modules: list | None = None,
) -> Iterator[None]:
    """The mechanics: row-invariant matmuls, reductions and element-wise functions, attention per row, the model
    routed to it, and with `catch_sdpa` the SDPA calls it makes itself; all undone after. `classes`: which parts;
    `library_on_cpu`: ops whose CPU kernels stay the library's; `modules`: the model's, where walked already."""
    if "attention" not in classes:
        with contextlib.ExitStack() as stack:
            _enter_kernels(stack, model, classes, library_on_cpu, modules)
            yield
        return
    with contextlib.ExitStack() as stack:
        _enter_kernels(stack, model, classes, library_on_cpu, modules)
        if takes_attention_interface(model):
            stack.enter_context(AttentionRouting(model, attend_in_order, modules))
        if catch_sdpa:
            stack.enter_context(InOrderSdpa())
        yield


def _enter_kernels(
    stack: contextlib.ExitStack, model, classes: tuple[str, ...], library_on_cpu: frozenset, modules: list | None
) -> None:
    """The kernel scopes of `classes` (but the CPU kernels of `library_on_cpu`); with matmuls, the model's linear
    layers computing their rows themselves; with element-wise functions, its activation modules."""
    for name, scope in _KERNEL_SCOPES.items():
        if name in classes:
            stack.enter_context(scope(library_on_cpu))
    if "matmul" in classes:
        stack.enter_context(RowInvariantLinears(model, modules))
    if "elementwise" in classes and any(p.is_cpu for p in model.parameters()):
        stack.enter_context(TailFreeActivations(model, modules))
