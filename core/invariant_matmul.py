"""Matmuls whose result for one row does not depend on how many rows share the call.

A GEMM library blocks and threads a call by its shape: on CPU a call of a few rows goes to other kernels than
one of hundreds, and on CUDA cuBLAS picks a kernel per shape. So a token's row of a linear layer can round
differently inside a padded batch than alone. While `RowInvariantMatmuls` is entered, aten's mm, addmm, bmm,
baddbmm and _grouped_mm (MoE experts) are re-registered so that every row meets one kernel and one reduction
order whatever the call's height:
- a call under `tile_rows(device)` rows is padded with zero rows to exactly that height;
- a taller call goes to the library whole where this machine's library was measured to keep a row's result
  independent of the call's height above the tile (`_library_keeps_rows`, per shape, dtype and layout), and is
  cut into fixed-height tiles where it was not (and on CUDA, where it never is).
The replacements call the `out=` overloads, which are separate operators: calling `torch.mm` from the mm
override would call the override again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from .scoped_kernels import ScopedKernels

# The dispatch keys the replacements are registered for: the mechanism is not CPU-specific.
_DEVICE_KEYS = ("CPU", "CUDA")
_CPU_TILE_ROWS = 16
# Kernel launches cost more than padding on a GPU: taller tiles there.
_GPU_TILE_ROWS = 64


def tile_rows(device: torch.device) -> int:
    """The fixed call height every row is computed in on `device`."""
    return _CPU_TILE_ROWS if device.type == "cpu" else _GPU_TILE_ROWS


# (op, device type, dtype, shape and layout of everything but the rows) -> whether the library keeps rows
_measured: dict[tuple, bool] = {}
_measured_lock = threading.Lock()

RowsFn = Callable[[torch.Tensor], torch.Tensor]  # rows of the row operand -> those rows of the result


def _padded(rows: torch.Tensor, height: int, dim: int) -> torch.Tensor:
    missing = height - rows.shape[dim]
    if missing == 0:
        return rows
    shape = list(rows.shape)
    shape[dim] = missing
    return torch.cat([rows, rows.new_zeros(shape)], dim=dim)


def _by_rows(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> torch.Tensor:
    """`compute(a)` with every row of `a` (along `dim`) computed in a call of one fixed height or, where the
    library keeps rows independent of the height above it, in the library's own call."""
    height = tile_rows(a.device)
    m = a.shape[dim]
    if m == 0:
        return compute(a)
    if m <= height:
        return compute(_padded(a, height, dim)).narrow(dim, 0, m).clone()
    if _library_keeps_rows(a, dim, key, compute):
        return compute(a)
    tiles = [compute(_padded(a.narrow(dim, s, min(height, m - s)), height, dim)) for s in range(0, m, height)]
    return torch.cat(tiles, dim=dim).narrow(dim, 0, m)


def _library_keeps_rows(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> bool:
    """Measured once per key on random rows: does a call of any height above the tile give each row the
    same bits as the fixed-height tiles? Never assumed on CUDA, where cuBLAS picks kernels per shape."""
    if a.device.type != "cpu":
        return False
    key = (key, a.dtype, tuple(a.shape[:dim]), tuple(a.shape[dim + 1 :]), a.stride(-1) == 1)
    with _measured_lock:
        if key in _measured:
            return _measured[key]
    height = tile_rows(a.device)
    probe_rows = 4 * height + 3
    shape = list(a.shape)
    shape[dim] = probe_rows
    probe = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(a.dtype)
    tiled = torch.cat(
        [
            compute(_padded(probe.narrow(dim, s, min(height, probe_rows - s)), height, dim))
            for s in range(0, probe_rows, height)
        ],
        dim=dim,
    ).narrow(dim, 0, probe_rows)
    keeps = all(
        torch.equal(compute(probe.narrow(dim, 0, rows)), tiled.narrow(dim, 0, rows))
        for rows in (height + 1, probe_rows)
    )
    with _measured_lock:
        _measured[key] = keeps
    return keeps


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def compute(rows):
        return torch.ops.aten.mm.out(rows, b, out=rows.new_empty((rows.shape[0], b.shape[1])))

    return _by_rows(a, 0, ("mm", tuple(b.shape), b.stride()), compute)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if bias.dim() == 2 and bias.shape[0] != 1:
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
    # The bias may vary along the rows: product first (row-invariant), then the element-wise sum.
    product = _bmm(a, b)
    if beta == 0:
        return torch.ops.aten.mul(product, alpha)
    return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), product, alpha=alpha)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """MoE experts: token rows grouped by expert (`offs`: each group's end), each group through `_mm`, so a
    token's row does not depend on how many other tokens its expert got."""
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
        return {(name, key): fn for name, fn in _REPLACEMENTS.items() for key in _DEVICE_KEYS}
