"""Matmuls whose result for one row does not depend on how many rows share the call.

A GEMM library blocks and threads a call by its shape: on CPU a call of a few rows goes to other kernels than
one of hundreds, and on CUDA cuBLAS picks a kernel per shape. So a token's row of a linear layer can round
differently inside a padded batch than alone. While `RowInvariantMatmuls` is entered, aten's mm, addmm, bmm,
baddbmm and _grouped_mm (MoE experts) are re-registered so that every row meets one kernel and one reduction
order whatever the call's height (on CUDA the Triton kernel, `triton_kernels`; elsewhere `rows.by_rows`: through the
library where it was measured to keep rows, else in fixed-height tiles).

A linear layer's product (rows times a weight stored as nn.Linear stores it, so that its transpose is the
operand) has a second path on CPU: oneDNN's inner product on that weight as it is (no copy). Where the GEMM
library keeps rows only from 16 rows (MKL's float32 on every x86 CPU measured, AVX-512 and AVX2 alike), a
decoding step of one row would be padded to a 16-row GEMM; oneDNN keeps rows from 1 or 2 and is the faster
of the two at a few rows, so the mode then takes it, for every call of that shape (`rows.by_rows` measures both
and takes the one that keeps rows from fewer).
A weight of at most `_SMALL_BYTES` (a small model's) is "small": a call by it costs the kernel's fixed cost more
than its arithmetic, and MKL's is the least, so the library is taken wherever it keeps rows (`library_first`).
A row is computed the same way in every pass, a prefill's, a decoding step's and a trainer's (a text's logits do not
depend on how its tokens arrive): no path is a decoding step's own.
The replacements call the bindings' `out=` forms (`torch.mm(..., out=)`), the out overloads, which are separate
operators: calling `torch.mm` without `out` from the mm override would call the override again.
"""

from __future__ import annotations

import torch

from ..compat.torch import onednn_linear_pointwise
from .gpu_kernels import triton_kernels
from .rows import DEVICE_KEYS, Path, RowsFn, by_rows
from .scopes import ScopedKernels

# The dtypes oneDNN's inner product takes (where this CPU has the kernels: the measurement finds out).
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_ONEDNN = torch.backends.mkldnn.is_available()
# The largest "small" weight: one whose call costs the kernel's fixed cost more than its arithmetic.
_SMALL_BYTES = 16 << 20


def small_operand(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `b` ([in, out]) is a small weight on CPU (see the module's doc)."""
    return a.device.type == "cpu" and b.numel() * b.element_size() <= _SMALL_BYTES


def onednn_usable(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN's inner product takes `a` (rows) times `weight` ([out, in], as nn.Linear stores it) plus
    `bias` (one value per output) as they are."""
    return (
        _ONEDNN
        and a.device.type == "cpu"
        and a.dim() == 2
        and a.dtype in _ONEDNN_DTYPES
        and weight.dtype == a.dtype
        and weight.is_contiguous()
        and (bias is None or (bias.dtype == a.dtype and bias.shape == (weight.shape[0],) and bias.is_contiguous()))
    )


def onednn_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> RowsFn:
    """oneDNN's inner product: `rows @ weight.T + bias`, the weight read as nn.Linear stores it."""
    return lambda rows: onednn_linear_pointwise(rows, weight, bias)


def _onednn(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> list[Path]:
    """oneDNN's inner product, where `b` is a linear layer's weight transposed (nn.Linear's [out, in], read as
    it is) and the bias, if any, one value per output: `rows @ b + bias`."""
    weight = b.t()
    if not onednn_usable(a, weight, bias):
        return []
    return [("onednn", onednn_linear(weight, bias))]


def _fixed_order(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """`a @ b (+ bias)` through the Triton kernel where the mode takes it for them (CUDA: `gpu_kernels`): any height in
    one call, nothing measured; None elsewhere."""
    kernels = triton_kernels(a)
    if kernels is None or b.dtype != a.dtype or (bias is not None and bias.dtype != a.dtype):
        return None
    return kernels.fixed_order_matmul(a, b, None if bias is None else bias.reshape(-1).contiguous())


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def library(rows):
        return torch.mm(rows, b, out=rows.new_empty((rows.shape[0], b.shape[1])))

    if not RowInvariantMatmuls.active():  # another thread's call: the library's own
        return library(a)
    if (fixed := _fixed_order(a, b)) is not None:
        return fixed
    key = ("mm", b.shape, b.stride())
    return by_rows(a, 0, key, library, lambda: _onednn(a, b), library_first=small_operand(a, b), operand=b)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if bias.dim() == 2 and bias.shape[0] != 1 and RowInvariantMatmuls.active():
        # A bias with a row per row: the product row-invariant, the (element-wise) sum after it.
        return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), _mm(a, b), alpha=alpha)

    def library(rows):
        out = rows.new_empty((rows.shape[0], b.shape[1]))
        return torch.addmm(bias, rows, b, beta=beta, alpha=alpha, out=out)

    if not RowInvariantMatmuls.active():
        return library(a)
    one_per_column = beta == 1 and alpha == 1 and bias.numel() == b.shape[1] and bias.shape[-1] == b.shape[1]
    if one_per_column and (fixed := _fixed_order(a, b, bias)) is not None:
        return fixed

    def others():
        return _onednn(a, b, bias.reshape(-1)) if beta == 1 and alpha == 1 else []

    key = ("addmm", b.shape, b.stride(), bias.shape, beta, alpha)
    return by_rows(a, 0, key, library, others, library_first=small_operand(a, b), operand=b)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def library(rows):
        return torch.bmm(rows, b, out=rows.new_empty((rows.shape[0], rows.shape[1], b.shape[2])))

    if not RowInvariantMatmuls.active():
        return library(a)
    if (fixed := _fixed_order(a, b)) is not None:
        return fixed
    return by_rows(a, 1, ("bmm", b.shape, b.stride()), library, operand=b)


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if not RowInvariantMatmuls.active():
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        return torch.baddbmm(bias, a, b, beta=beta, alpha=alpha, out=out)
    # The bias may vary along the rows: product first (row-invariant), then the element-wise sum.
    product = _bmm(a, b)
    if beta == 0:
        return torch.ops.aten.mul(product, alpha)
    return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), product, alpha=alpha)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """MoE experts: token rows grouped by expert (`offs`: each group's end), each group through `_mm`, so a
    token's row does not depend on how many other tokens its expert got. (In a thread outside the mode: one
    library mm per group, which is what ATen's CPU kernel computes.) The experts' weight gradient, 2-D by 2-D grouped
    along the tokens (`_expert_weight_grads`), is the library's: the mode's promise is the forward's."""
    if bias is None and a.dim() == 2 and b.dim() == 2 and offs is not None:
        return _expert_weight_grads(a, b, offs, out_dtype)
    if bias is not None or a.dim() != 2 or b.dim() != 3 or offs is None:
        raise NotImplementedError("batch-invariant mode covers _grouped_mm of 2-D tokens by 3-D expert weights")
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    dtype = out_dtype or a.dtype
    out = a.new_zeros((a.shape[0], b.shape[2]), dtype=dtype)
    for expert, (start, end) in enumerate(zip(starts, ends)):
        if end > start:
            out[start:end] = _mm(a[start:end], b[expert]).to(dtype)
    return out


def _expert_weight_grads(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype) -> torch.Tensor:
    """[groups, K, N]: each group's `a[:, start:end] @ b[start:end]` ([K, T] by [T, N], grouped along T: a MoE
    backward's gradient of the experts' weights), by the library's mm (its out overload, not replaced)."""
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    dtype = out_dtype or a.dtype
    out = a.new_zeros((len(ends), a.shape[0], b.shape[1]), dtype=dtype)
    for group, (start, end) in enumerate(zip(starts, ends)):
        if end > start:
            product = torch.mm(a[:, start:end], b[start:end], out=a.new_empty((a.shape[0], b.shape[1])))
            out[group] = product.to(dtype)
    return out


_REPLACEMENTS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm, "_grouped_mm": _grouped_mm}


def _no_sum(a: torch.Tensor, b: torch.Tensor, *args, **kwargs):
    """A product over one term (a rotary embedding's frequencies times positions): every element is one rounded
    product, in any kernel and any blocking."""
    return ("one term",) if a.shape[-1] == 1 else None


def _bias_added(*args, **kwargs):
    """A bias added in the kernel rounds once or twice by kernel: any call outside a layer may need the replacement."""
    return None


# op -> what makes a CPU call of it need no replacement whatever the batch, None where it may (`invariant.census`;
# the calls a model's linear layers make are computed at the layer in the mode, `invariant.linear`, and need none)
_NEEDLESS_ON_CPU = {"mm": _no_sum, "bmm": _no_sum, "addmm": _bias_added, "baddbmm": _bias_added}


class RowInvariantMatmuls(ScopedKernels):
    """aten's matmuls replaced, on CPU and CUDA, while entered."""

    needless_on_cpu = _NEEDLESS_ON_CPU

    def kernels(self) -> dict:
        return {(name, key): fn for name, fn in _REPLACEMENTS.items() for key in DEVICE_KEYS}
