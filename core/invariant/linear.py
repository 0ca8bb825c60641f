"""Linear layers whose rows do not depend on how many share the call, computed at the layer (CPU).

The mode's aten matmuls (`invariant.matmul`) cover every product, but each call crosses into Python twice
(the dispatcher's, then the choice of path): on a model of a few million weights, where a linear layer's call
costs tens of microseconds, that is what the mode cost. While `RowInvariantLinears(model)` is entered, each
`nn.Linear` of the model (the class itself, not a subclass with its own forward) computes its rows in its own
forward: oneDNN's inner product on the weight as stored where it keeps rows from the fewest rows (one call into
C++, as fast as the library's or faster), else the GEMM library's op (`rows.by_rows` measures both, per shape,
dtype and thread count; a decoding step's few rows each as the library computes one row alone where that is
what keeps rows from one: `rows`). Another thread's call, or a call outside the mode, is the layer's own.
"""

from __future__ import annotations

import torch

from .matmul import RowInvariantMatmuls, alone_product, onednn_linear, onednn_usable, small_operand
from .phase import pass_kind
from .rows import choose, in_rows
from .scopes import ModuleForwards


def _library(weight: torch.Tensor, bias: torch.Tensor | None):
    """The GEMM library's op on rows times the layer's weight. Where the mode replaces the op's CPU kernel now, through
    the binding's `out=` form (the out overload, which it does not replace); where not (a model the census found
    making no call of it elsewhere: `invariant.census`), the op itself, which allocates its result in C++: on a slow
    core the Python allocation cost a fifth of a small layer's call. Either way the same kernel on the same rows."""
    op, out_features, operand = ("mm" if bias is None else "addmm"), weight.shape[0], weight.t()
    replaced = RowInvariantMatmuls.replaces

    def product(rows: torch.Tensor) -> torch.Tensor:
        if replaced(op, "CPU"):  # (were it replaced after this look, its kernel computes this same call: `matmul`)
            out = rows.new_empty((rows.shape[0], out_features))
            return torch.mm(rows, operand, out=out) if bias is None else torch.addmm(bias, rows, operand, out=out)
        return torch.mm(rows, operand) if bias is None else torch.addmm(bias, rows, operand)

    return product


def _paths(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """`choose`'s arguments after the key for `rows` times this layer's weight: (first path, the others, the
    first's name, a decoding step's path, whether the library comes first). oneDNN first where it takes them as they
    are (one call into C++), else the GEMM library's op alone."""
    library = _library(weight, bias)
    alone, small = alone_product(rows, weight.t(), bias, library), small_operand(rows, weight)
    if onednn_usable(rows, weight, bias):
        return onednn_linear(weight, bias), lambda: [("library", library)], "onednn", alone, small
    return library, tuple, "library", alone, small


class _Forward:
    """A linear layer's forward in the mode: its rows through the path `choose` takes for its shape (kept per
    thread count and phase, so that a call costs a lookup), the layer's own elsewhere."""

    def __init__(self, module: torch.nn.Linear) -> None:
        self.original = module.forward
        self._weight, self._bias = module.weight, module.bias
        self._dtype, self._in, self._out = module.weight.dtype, module.in_features, module.out_features
        self._chosen: dict[tuple, tuple] = {}  # (thread count, decoding) -> (compute, floor)

    def takes(self, x: torch.Tensor) -> bool:
        """Whether a call on `x` is computed here in the mode (else by the layer's own forward)."""
        return x.dtype == self._dtype and x.shape[-1] == self._in

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Every linear layer's call of every pass comes through here: each Python step costs a small model's pass.
        if x.dtype != self._dtype or x.shape[-1] != self._in or not RowInvariantMatmuls.active():
            return self.original(x)
        rows = x.reshape(-1, self._in)
        kind = pass_kind()
        chosen = self._chosen.get(kind)
        if chosen is None:
            if rows.shape[0] == 0:
                return self.original(x)
            key = ("linear", self._weight.shape, self._bias is not None)
            chosen = self._chosen[kind] = choose(rows, 0, key, *_paths(rows, self._weight, self._bias))
        return in_rows(rows, 0, *chosen).view(*x.shape[:-1], self._out)  # (a Size as one argument parses slowly)


class RowInvariantLinears(ModuleForwards):
    """The CPU `nn.Linear` layers of a model computing their rows themselves while entered (`ModuleForwards`). Enter
    it inside `RowInvariantMatmuls`."""

    def forward_for(self, module: torch.nn.Module) -> _Forward | None:
        return _Forward(module) if type(module) is torch.nn.Linear and module.weight.device.type == "cpu" else None

    def computes_itself(self, forward: _Forward, args: tuple) -> bool:
        return bool(args) and isinstance(args[0], torch.Tensor) and forward.takes(args[0])
