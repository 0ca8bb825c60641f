"""Element-wise functions that give an element the same bits wherever it sits in its tensor (CPU).

ATen's CPU kernels run a tensor's elements through a vector body, two vectors at a time, and the few left at the
end of each thread's share through a scalar loop; for transcendental functions (silu, sigmoid, rsqrt, sin...)
the two paths round differently. Which elements fall in a tail depends on the tensor's size and the thread
split, so the same activation value of a token can differ between a batch and a single run. While
`TailFreeElementwise` is entered, these functions run on the flattened tensor padded to a length that every
thread's share divides into whole vector steps: every element takes the vector path. GPUs compute an element
the same way wherever it is, so only the CPU kernels are replaced. A model's activation modules compute the same at
the module while `TailFreeActivations` is entered: no crossing from aten's dispatcher into Python for an MLP's silu.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..compat.torch import nn_binding
from .gradients import plain_backward
from .scopes import ModuleForwards, ScopedKernels, has_own_forward

# Bytes of one step of the widest vector body (two 512-bit vectors): 64 elements of bfloat16, 32 of float32 (the
# steps of the narrower AVX2 vectors divide them).
_STEP_BYTES = 128
# The share below which ATen runs an element-wise kernel on one thread (at::internal::GRAIN_SIZE).
_GRAIN = 32768


# GELU's kernel sets its own split: past 16,384 elements, one share per thread (ATen's GeluKernel).
_GELU_SPLIT_FROM = 16384


def _shares(length: int, threads: int, op: str | None) -> int:
    """How many threads ATen splits an element-wise call of `length` elements across."""
    if op == "gelu":
        return threads if length > _GELU_SPLIT_FROM else 1
    return max(1, min(threads, -(-length // _GRAIN)))


@functools.lru_cache(maxsize=4096)
def tail_free_length(n: int, threads: int, itemsize: int = 2, op: str | None = None) -> int:
    """The smallest length >= n that ATen's thread split (of `op`'s kernel) cuts into shares of whole vector steps,
    for elements of `itemsize` bytes."""
    step = _STEP_BYTES // itemsize
    length = -(-n // step) * step
    while True:
        used = _shares(length, threads, op)
        if length % (step * used) == 0:
            return length
        length = -(-length // (step * used)) * (step * used)


def _through_the_vector_body(out_op, x: torch.Tensor, op: str | None, *args, **kwargs) -> torch.Tensor:
    """`out_op(x, ...)` (a binding's `out=` form) on a tensor padded so that no element falls in a scalar tail."""
    n = x.numel()
    length = tail_free_length(n, torch.get_num_threads(), x.element_size(), op)
    if length == n and x.is_contiguous():  # no tail anywhere: the tensor as it is (the same loop, flattened)
        return out_op(x, *args, **kwargs, out=torch.empty_like(x))
    padded = x.new_empty(length)  # what the padding holds is computed and dropped: no need to clear it
    head = padded[:n].view_as(x)  # (a Size as an argument parses slowly: a third of this call)
    head.copy_(x)
    out_op(padded, *args, **kwargs, out=padded)  # element by element: in place computes the same
    return head


def _tail_free(out_op, exact_in: tuple[torch.dtype, ...] = (), op: str | None = None):
    """`out_op`'s function (a binding with `out=`, which calls the op's out overload: not replaced) on a tensor with
    no element in a scalar tail; `exact_in`: dtypes whose vector and scalar paths compute the same (correctly
    rounded) result, for which any tail will do; `op`: the op's name, where its kernel splits its own way."""

    def run(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if x.dtype in exact_in or not TailFreeElementwise.active():  # the library's own
            return out_op(x, *args, **kwargs, out=torch.empty_like(x))
        return _through_the_vector_body(out_op, x, op, *args, **kwargs)

    return run


def tail_free(op, x: torch.Tensor) -> torch.Tensor:
    """`op(x)` (a binding with an `out=` form: torch.exp, torch.tanh...) with every element through the vector body
    on the CPU, whatever the mode's scopes: the mode's own attention computes its exponentials so."""
    return op(x) if x.device.type != "cpu" else _through_the_vector_body(op, x, None)


_OPS = ("silu", "gelu", "sigmoid", "tanh", "exp", "rsqrt", "erf", "log", "sin", "cos")
# rsqrt's vector body is 1 / sqrt(x), two correctly rounded operations, as its scalar tail is in float32 and float64
# (an RMSNorm's, called on one value per row: a tail in every short call); in bfloat16 and float16 the tail rounds
# sqrt to the narrow type before dividing, so those still need no tail.
_EXACT_IN = {"rsqrt": (torch.float32, torch.float64)}


def _exact(name: str):
    def rule(x: torch.Tensor, *args, **kwargs):
        return ("exact", x.dtype) if x.dtype in _EXACT_IN.get(name, ()) else None

    return rule


# op -> what makes a call of it (its arguments) need no tail-free run whatever its size, None where one may
_NEEDLESS_ON_CPU = {name: _exact(name) for name in _OPS}


def _binding(name: str):
    """The Python binding of the op (its `out=` form is the out overload), where torch has one: a third of the call's
    cost of `torch.ops.aten.<name>.out`."""
    return nn_binding(name) or getattr(torch, name)


class TailFreeElementwise(ScopedKernels):
    """The CPU kernels of `_OPS` replaced while entered."""

    needless_on_cpu = _NEEDLESS_ON_CPU

    def kernels(self) -> dict:
        return {(name, "CPU"): _tail_free(_binding(name), _EXACT_IN.get(name, ()), name) for name in _OPS}


@functools.cache
def _activation_ops() -> dict[type, str]:
    """Activation modules whose forward can be one call of a replaced op on its input, class -> op: torch's, and the
    classes transformers' `ACT2FN` gives for those ops (a gelu module's call: `_gelu_arguments`)."""
    from transformers.activations import GELUActivation, GELUTanh, SiLUActivation

    return {
        torch.nn.SiLU: "silu",
        SiLUActivation: "silu",
        torch.nn.Sigmoid: "sigmoid",
        torch.nn.Tanh: "tanh",
        torch.nn.GELU: "gelu",
        GELUActivation: "gelu",
        GELUTanh: "gelu",
    }


def _gelu_arguments(module: torch.nn.Module) -> dict | None:
    """The arguments of the one gelu call a gelu module makes (its `approximate`); None for one that computes a
    formula of several ops in Python (transformers' `use_gelu_python`)."""
    if isinstance(module, torch.nn.GELU):
        return {"approximate": module.approximate}
    act = getattr(module, "act", None)  # transformers': F.gelu, or a partial of it with `approximate`
    if act is torch.nn.functional.gelu:
        return {}
    if isinstance(act, functools.partial) and act.func is torch.nn.functional.gelu and not act.args:
        return dict(act.keywords) if set(act.keywords) <= {"approximate"} else None
    return None


def _activation_call(module: torch.nn.Module) -> tuple[str, dict] | None:
    """(op, its arguments) of the one call an activation module's forward is, where `TailFreeActivations` computes
    it at the module (not in place); None elsewhere."""
    op = _activation_ops().get(type(module))
    if op is None or getattr(module, "inplace", False):
        return None
    arguments = _gelu_arguments(module) if op == "gelu" else {}
    return None if arguments is None else (op, arguments)


class TailFreeActivations(ModuleForwards[Callable]):
    """A model's activation modules (`_activation_ops`; not in place) computing in their own forward what the
    replaced kernel computes, through the op's `out=` form: a call does not cross from aten's dispatcher into Python
    (an MLP's silu, on a model of a few million weights a percent of a pass). Enter it inside
    `TailFreeElementwise`, for a model on the CPU (on a GPU the padding would be for nothing)."""

    @staticmethod
    def covers(module: torch.nn.Module) -> bool:
        return _activation_call(module) is not None and not has_own_forward(module)

    def forward_for(self, module: torch.nn.Module):
        call = _activation_call(module)
        if call is None:
            return None
        op, arguments = call
        binding = _binding(op)
        run = _tail_free(binding, _EXACT_IN.get(op, ()), op)
        if arguments:
            run, binding = functools.partial(run, **arguments), functools.partial(binding, **arguments)

        def forward(x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled() and x.requires_grad:  # a trainer's forward: the op's own backward
                return plain_backward(run, binding, x)
            return run(x)

        return forward
