"""Computing each row of a call the way one fixed call height computes it, whatever the call's height.

Kernels that treat rows independently in arithmetic still pick their blocking, threading and reduction order
by the call's shape (a GEMM library's kernels, CUDA's reduction configuration, a CPU reduction split across
threads). `by_rows(a, dim, key, compute)` runs `compute` so that a row of `a` gets the bits it gets in a call
of one fixed height:
- where this machine's library was measured to give a row the same bits in any call of h or more rows
  (`_row_keeping_height`, per key, shape, dtype, layout and thread count: often h is 1 or 2), a call of h or
  more rows goes to the library whole and a shorter one is padded with zero rows to h;
- elsewhere (and always on CUDA, where the library picks kernels per shape) every row is computed in a call of
  exactly `tile_rows(device)` rows: shorter calls padded, taller ones cut into tiles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

# The dispatch keys replacements are registered for: the mechanism is not CPU-specific.
DEVICE_KEYS = ("CPU", "CUDA")
_CPU_TILE_ROWS = 16
# Kernel launches cost more than padding on a GPU: taller tiles there.
_GPU_TILE_ROWS = 64


def tile_rows(device: torch.device) -> int:
    """The fixed call height every row is computed in on `device`."""
    return _CPU_TILE_ROWS if device.type == "cpu" else _GPU_TILE_ROWS


# (key, dtype, shape and layout of everything but the rows, threads) -> the height from which the library keeps
# rows
_measured: dict[tuple, int | None] = {}
_measured_lock = threading.Lock()

RowsFn = Callable[[torch.Tensor], torch.Tensor]  # rows of the row operand -> those rows of the result


def _padded(rows: torch.Tensor, height: int, dim: int) -> torch.Tensor:
    missing = height - rows.shape[dim]
    if missing == 0:
        return rows
    shape = list(rows.shape)
    shape[dim] = missing
    return torch.cat([rows, rows.new_zeros(shape)], dim=dim)


def by_rows(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> torch.Tensor:
    """`compute(a)` with every row of `a` (along `dim`) getting the bits it gets in a call of one fixed height:
    a shorter call padded to that height, a taller one through the library where it keeps rows (measured),
    else in tiles of the fixed height. `key` names the computation (the operation and its other operands)."""
    m = a.shape[dim]
    if m == 0:
        return compute(a)
    floor = _row_keeping_height(a, dim, key, compute)
    if floor is not None:
        return compute(a) if m >= floor else compute(_padded(a, floor, dim)).narrow(dim, 0, m).clone()
    height = tile_rows(a.device)
    if m <= height:
        return compute(_padded(a, height, dim)).narrow(dim, 0, m).clone()
    tiles = [compute(_padded(a.narrow(dim, s, min(height, m - s)), height, dim)) for s in range(0, m, height)]
    return torch.cat(tiles, dim=dim).narrow(dim, 0, m)


# The call heights tried, smallest first: a library often takes other kernels for one row or a few.
_FLOORS = (1, 2, 4, 8, 16)


def _row_keeping_height(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> int | None:
    """The smallest height h such that, measured once per key on random rows, the library gives every row of a
    call of h or more rows the bits that row gets in a call of exactly h rows (wherever it sits); None when not
    even 16 rows do, and always on CUDA, where the library picks kernels per shape (then: fixed-height tiles)."""
    if a.device.type != "cpu":
        return None
    # The library blocks a call by its thread count too, and that count is per thread (the app's workers run
    # with one core fewer than the main thread): a measurement holds for one count only.
    threads = torch.get_num_threads()
    key = (key, a.dtype, tuple(a.shape[:dim]), tuple(a.shape[dim + 1 :]), a.stride(-1) == 1, threads)
    with _measured_lock:
        if key in _measured:
            return _measured[key]
    shape = list(a.shape)
    shape[dim] = 67
    probe = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(a.dtype)
    floor = next((h for h in _FLOORS if _keeps_rows_from(h, probe, dim, compute)), None)
    with _measured_lock:
        _measured[key] = floor
    return floor


def _keeps_rows_from(height: int, probe: torch.Tensor, dim: int, compute: RowsFn) -> bool:
    """Do the first and the last `height` rows of calls of several heights above `height` get the bits of a
    `height`-row call of just those rows?"""
    for rows in sorted({height + 1, height + 2, 2 * height + 1, 3 * height + 2, 17, 40, probe.shape[dim]}):
        whole = compute(probe.narrow(dim, 0, rows))
        for start in (0, rows - height):
            alone = compute(probe.narrow(dim, start, height))
            if not torch.equal(whole.narrow(dim, start, height), alone):
                return False
    return True
