"""Matmuls whose result for one row does not depend on how many rows share the call.

A GEMM library blocks and threads a call by its shape: on CPU a call of a few rows goes to other kernels than
one of hundreds, and on CUDA cuBLAS picks a kernel per shape. So a token's row of a linear layer can round
differently inside a padded batch than alone. While `RowInvariantMatmuls` is entered, aten's mm, addmm, bmm,
baddbmm and _grouped_mm (MoE experts) are re-registered so that every row meets one kernel and one reduction
order whatever the call's height (`rows.by_rows`: through the library where it was measured to keep
rows, else in fixed-height tiles).
The replacements call the `out=` overloads, which are separate operators: calling `torch.mm` from the mm
override would call the override again.
"""

from __future__ import annotations

import torch

from .rows import DEVICE_KEYS, RowsFn, by_rows
from .scopes import ScopedKernels


def _by_rows(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> torch.Tensor:
    if not RowInvariantMatmuls.active():  # another thread's call: the library's own
        return compute(a)
    return by_rows(a, dim, key, compute)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def compute(rows):
        return torch.ops.aten.mm.out(rows, b, out=rows.new_empty((rows.shape[0], b.shape[1])))

    return _by_rows(a, 0, ("mm", tuple(b.shape), b.stride()), compute)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if bias.dim() == 2 and bias.shape[0] != 1 and RowInvariantMatmuls.active():
        # A bias with a row per row: the product row-invariant, the (element-wise) sum after it.
        return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), _mm(a, b), alpha=alpha)

    def compute(rows):
        out = rows.new_empty((rows.shape[0], b.shape[1]))
        return torch.ops.aten.addmm.out(bias, rows, b, beta=beta, alpha=alpha, out=out)

    return _by_rows(a, 0, ("addmm", tuple(b.shape), b.stride(), tuple(bias.shape), beta, alpha), compute)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def compute(rows):
        return torch.ops.aten.bmm.out(rows, b, out=rows.new_empty((rows.shape[0], rows.shape[1], b.shape[2])))

    return _by_rows(a, 1, ("bmm", tuple(b.shape), b.stride()), compute)


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if not RowInvariantMatmuls.active():
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        return torch.ops.aten.baddbmm.out(bias, a, b, beta=beta, alpha=alpha, out=out)
    # The bias may vary along the rows: product first (row-invariant), then the element-wise sum.
    product = _bmm(a, b)
    if beta == 0:
        return torch.ops.aten.mul(product, alpha)
    return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), product, alpha=alpha)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """MoE experts: token rows grouped by expert (`offs`: each group's end), each group through `_mm`, so a
    token's row does not depend on how many other tokens its expert got. (In a thread outside the mode: one
    library mm per group, which is what ATen's CPU kernel computes.)"""
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


_REPLACEMENTS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm, "_grouped_mm": _grouped_mm}


class RowInvariantMatmuls(ScopedKernels):
    """aten's matmuls replaced, on CPU and CUDA, while entered."""

    def kernels(self) -> dict:
        return {(name, key): fn for name, fn in _REPLACEMENTS.items() for key in DEVICE_KEYS}
