"""Linear layers whose rows do not depend on how many share the call, computed at the layer (CPU).

The mode's aten matmuls (`invariant.matmul`) cover every product, but each call crosses into Python twice
(the dispatcher's, then the choice of path): on a model of a few million weights, where a linear layer's call
costs tens of microseconds, that is what the mode cost. While `RowInvariantLinears(model)` is entered, each
`nn.Linear` of the model (the class itself, not a subclass with its own forward) computes its rows in its own
forward: oneDNN's inner product on the weight as stored where it keeps rows from the fewest rows (one call into
C++, as fast as the library's or faster), else the GEMM library's op (`rows.by_rows` measures both, per shape,
dtype and thread count: `rows`): float16 and float64 layers, and every layer where the compiled kernels are not
built. A float32 or bfloat16 layer goes to the compiled fixed-order kernel instead (`compiled_kernels`): a row's bits
the same at any height by construction, so a decoding step is not padded to the GEMM library's 16 rows nor a prefill
padded up to a height checked, and nothing is measured (as fast as MKL's and oneDNN's calls or faster, from a
256x1536 layer to a 151936x1536 head: docs/measurements.md). Another thread's call, or a call outside the mode, is
the layer's own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F

from .compiled_kernels import compiled_linear
from .gpu_kernels import triton_kernels
from .gradients import linear_plain_backward
from .matmul import RowInvariantMatmuls, onednn_linear, onednn_usable, small_operand
from .measured_store import kernel_site
from .rows import MEASURED_ROWS, Path, RowsFn, choose, in_rows, record_any_height
from .scopes import ModuleForwards, has_own_forward

_NO_BIAS = torch.empty(0)


def _op(bias: torch.Tensor | None) -> str:
    """The aten op a layer's product is (`F.linear` on rows: addmm with a bias, mm without)."""
    return "mm" if bias is None else "addmm"


def _library(weight: torch.Tensor, bias: torch.Tensor | None):
    """The GEMM library's op on rows times the layer's weight. Where the mode replaces the op's CPU kernel now, through
    the binding's `out=` form (the out overload, which it does not replace); where not (a model the census found
    making no call of it elsewhere: `invariant.census`), the op itself, which allocates its result in C++: on a slow
    core the Python allocation cost a fifth of a small layer's call. Either way the same kernel on the same rows."""
    op, out_features, operand = _op(bias), weight.shape[0], weight.t()
    replaced = RowInvariantMatmuls.replaces

    def product(rows: torch.Tensor) -> torch.Tensor:
        if replaced(op, "CPU"):  # (were it replaced after this look, its kernel takes this same path: `matmul`)
            out = rows.new_empty((rows.shape[0], out_features))
            return torch.mm(rows, operand, out=out) if bias is None else torch.addmm(bias, rows, operand, out=out)
        return torch.mm(rows, operand) if bias is None else torch.addmm(bias, rows, operand)

    return product


def _fixed_order(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[RowsFn, str] | None:
    """(`rows` times the layer's weight through a fixed-order kernel, its name) where one takes them: the Triton
    kernel where the mode takes it (`gpu_kernels`), else the compiled one (float32 or bfloat16 rows and parameters of
    one dtype, a weight whose rows are contiguous, the kernel built here); None elsewhere. The weight is read as it is
    at every call (a weight changed in place, by an optimizer or through `.data`, is read changed)."""
    takes = (
        weight.dtype == rows.dtype
        and weight.stride(-1) == 1
        and (bias is None or (bias.dtype == rows.dtype and bias.is_contiguous()))
    )
    if not takes:
        return None
    # (views of the parameters' data: an in-place change shows in them; a new tensor makes the layer's path anew)
    weights, biases = weight.detach(), (_NO_BIAS if bias is None else bias.detach())
    kernels = triton_kernels(rows)
    if kernels is not None:
        added = None if bias is None else biases
        return (lambda rows: kernels.fixed_order_matmul(rows, weights.t(), added)), "triton"
    op = compiled_linear(rows)
    if op is None:
        return None
    kernel: Callable = op

    def product(rows: torch.Tensor) -> torch.Tensor:
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        out = rows.new_empty((rows.shape[0], weights.shape[0]))
        return kernel(rows, weights, biases, torch.get_num_threads(), out)

    return product, "compiled"


def _paths(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, library
) -> tuple[RowsFn, Callable[[], Sequence[Path]], str, bool]:
    """`choose`'s arguments after the key for `rows` times this layer's weight (`library`: its `_library`): (first
    path, the others, the first's name, whether the library comes first). oneDNN first where
    it takes them as they are (one call into C++), else the GEMM library's op alone."""
    small = small_operand(rows, weight)
    if onednn_usable(rows, weight, bias):
        return onednn_linear(weight, bias), lambda: [("library", library)], "onednn", small
    return library, tuple, "library", small


class _Forward:
    """A linear layer's forward in the mode: its rows through the path `choose` takes for its shape (kept per
    thread count and phase, so that a call costs a lookup), the layer's own elsewhere."""

    def __init__(self, module: torch.nn.Linear) -> None:
        # Kept across entries by the layer (`_kept`): a weak reference to the layer, which must not keep it alive.
        self._module: Callable[[], Any] = weakref.ref(module)  # the layer, or None once it is gone
        self._weight, self._bias = module.weight, module.bias
        self._where = _where(module.weight, module.bias)
        self._dtype, self._in, self._out = module.weight.dtype, module.in_features, module.out_features
        self._library, self._op = _library(module.weight, module.bias), _op(module.bias)
        # (thread count, whether the op's CPU kernel is replaced now) -> (compute, floor, the elements between which a
        # call is the library's op whole, from the floor's rows to `MEASURED_ROWS`: such a call is `F.linear`'s own,
        # None where the path is another; the ceiling, None where `compute` takes any height in one call). The
        # library's path calls the op's out overload while the mode replaces the op, the op itself while not
        # (`_library`): two kernels, where one is registered for the op alone (a kernel library's), each measured for
        # itself.
        self._chosen: dict[tuple, tuple] = {}

    def original(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's own forward (`nn.Linear`'s)."""
        return F.linear(x, self._weight, self._bias)

    def current(self, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether this forward still computes the product of a layer's parameters `weight` and `bias`: the same
        parameters, their data where it was and of the dtype it was (a model moved or cast since changes them)."""
        return weight is self._weight and bias is self._bias and _where(weight, bias) == self._where

    def takes(self, x: torch.Tensor) -> bool:
        """Whether a call on `x` is computed here in the mode (else by the layer's own forward)."""
        return x.dtype == self._dtype and x.shape[-1] == self._in

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Every linear layer's call of every pass comes through here, and inside a pass a Python step costs several
        # times what it does alone (measured: this call's checks about 6 µs inside a comparison's passes, under 3
        # timed one by one): the way to `F.linear` is short. It is the layer's own forward: a call of another dtype
        # or width fails or casts there as it would outside.
        params = self._module()._parameters
        if (
            params.get("weight") is not self._weight
            or params.get("bias") is not self._bias
            or _where(self._weight, self._bias) != self._where  # (`weight.data = ...` keeps the Parameter)
        ):
            return self._replaced(x)
        op_replaced = RowInvariantMatmuls.replaces(self._op, "CPU")
        chosen = self._chosen.get((torch.get_num_threads(), op_replaced)) if RowInvariantMatmuls.active() else None
        if (
            chosen is not None
            and chosen[2] is not None
            and chosen[2][0] <= x.numel() <= chosen[2][1]
            and x.dim() > 1
            and x.is_contiguous()
            and not op_replaced
        ):
            # Rows the library's op takes whole, the op not replaced: `F.linear` is that op on the flattened rows
            # (addmm with the bias, mm without), the reshapes in C++ (a test holds the bits equal).
            return F.linear(x, self._weight, self._bias)
        return self._by_rows(x, chosen, op_replaced)

    def _replaced(self, x: torch.Tensor) -> torch.Tensor:
        """A call after the layer's weight or bias was replaced inside the block (a new Parameter, `weight.data = ...`,
        a head tied to the embeddings, a cast): computed with the layer's parameters as they are now, through paths
        chosen for them; the class's own forward where the mode no longer covers the layer."""
        module = self._module()
        if not RowInvariantLinears.covers(module):
            return torch.nn.Linear.forward(module, x)
        _Forward.__init__(self, module)
        return self(x)

    def _by_rows(self, x: torch.Tensor, chosen: tuple | None, op_replaced: bool) -> torch.Tensor:
        """A call `__call__` does not give `F.linear`: its rows through the path chosen (chosen here on a first call
        of the pass's kind), or the layer's own forward where the mode does not compute it. Under autograd, the
        backward is `F.linear`'s (`invariant.gradients`)."""
        if x.dtype != self._dtype or x.shape[-1] != self._in or not RowInvariantMatmuls.active():
            return self.original(x)
        if torch.is_grad_enabled():
            return linear_plain_backward(lambda: self._rows(x, chosen, op_replaced), x, self._weight, self._bias)
        return self._rows(x, chosen, op_replaced)

    def _rows(self, x: torch.Tensor, chosen: tuple | None, op_replaced: bool) -> torch.Tensor:
        rows = x.reshape(-1, self._in)
        if chosen is None:
            if rows.shape[0] == 0:
                return self.original(x)
            # the kernel the library's path reaches: the op's out overload while the mode replaces the op, the op
            # itself while not; one kind of call where both are one kernel (as torch registers them)
            site = kernel_site(f"aten::{self._op}.out" if op_replaced else f"aten::{self._op}")
            key = ("linear", self._weight.shape, self._bias is not None, site)
            fixed = _fixed_order(rows, self._weight, self._bias)
            if fixed is not None:  # any height, one call (`ceiling` None)
                record_any_height(rows, 0, key, fixed[1])
                self._chosen[torch.get_num_threads(), op_replaced] = (fixed[0], 1, None, None)
                return self(x)
            paths = _paths(rows, self._weight, self._bias, self._library)
            compute, floor, ceiling = choose(rows, 0, key, *paths, operand=self._weight.t())
            measured = (floor * self._in, MEASURED_ROWS * self._in) if floor is not None else None
            whole = measured if compute is self._library else None
            self._chosen[torch.get_num_threads(), op_replaced] = (compute, floor, whole, ceiling)
            return self(x)  # the call again, its path chosen
        compute, floor, _, ceiling = chosen
        computed = compute(rows) if ceiling is None else in_rows(rows, 0, compute, floor, ceiling)
        return computed.view(*x.shape[:-1], self._out)  # (a Size as one argument parses slowly)


def _where(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    held = (weight.data_ptr(), weight.dtype)
    return held if bias is None else (*held, bias.data_ptr(), bias.dtype)


# layer -> its forward in the mode, kept from one entry to the next with the paths chosen for it (making them again at
# every entry cost a small model's comparison a percent)
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forget_layer_paths() -> None:
    """The paths each layer chose dropped (`rows.forget_measured`): chosen again on their next call."""
    _kept.clear()


class RowInvariantLinears(ModuleForwards["_Forward"]):
    """The CPU `nn.Linear` layers of a model computing their rows themselves while entered (`ModuleForwards`). Enter
    it inside `RowInvariantMatmuls`."""

    @staticmethod
    def covers(module: torch.nn.Module) -> TypeGuard[torch.nn.Linear]:
        # Asked of every layer at every entry: the parameters are read from their dict, as
        # `nn.Module.__getattr__` costs a microsecond or two a read. A weight that is not a parameter (`weight_norm`
        # computes it anew before every call) is read by the layer's own forward, at the call: one kept here would be
        # the last pass's (its products are the mode's aten kernels' then).
        weight = module._parameters.get("weight") if type(module) is torch.nn.Linear else None
        return weight is not None and weight.is_cpu and not has_own_forward(module)

    def forward_for(self, module: torch.nn.Module) -> _Forward | None:
        if not self.covers(module):
            return None
        weight = module._parameters["weight"]
        forward = _kept.get(module)
        if forward is None or not forward.current(weight, module._parameters.get("bias")):
            forward = _kept[module] = _Forward(module)
        return forward

    def computes_itself(self, forward: _Forward, args: tuple) -> bool:
        return bool(args) and isinstance(args[0], torch.Tensor) and forward.takes(args[0])
