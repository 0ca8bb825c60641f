"""Computing each row of a call the way one fixed call height computes it, whatever the call's height.

Kernels that treat rows independently in arithmetic still pick their blocking, threading and reduction order
by the call's shape (a GEMM library's kernels, CUDA's reduction configuration, a CPU reduction split across
threads). `by_rows(a, dim, key, paths)` runs one of `paths` (ways to compute the same thing: the library's op
first, then others, such as another library's kernel for a linear layer) so that a row of `a` gets the bits it
gets in a call of one fixed height:
- where a path was measured on this machine to give a row the same bits in any call of h or more rows
  (`_row_keeping_path`, per key, shape, dtype, layout and thread count: often h is 1 or 2), the path with the
  smallest h is taken (the first on a tie): a call of h or more rows goes to it whole and a shorter one is
  padded with zero rows to h;
- where none keeps rows (and always on CUDA, where the library picks kernels per shape) every row is computed by
  the first path in a call of exactly `tile_rows(device)` rows: shorter calls padded, taller ones cut into tiles;
- on a small operand (`library_first`: a weight the CPU's caches hold) a call costs the kernel's fixed cost more
  than its arithmetic: the library is taken wherever it keeps rows at all (a call of its height or more is its
  own call), though another path keeps them from fewer (oneDNN's float32 call costs three times MKL's there);
- a call taller than `MEASURED_ROWS` is made only at a height the path was checked to keep rows at (one of
  `TALL_HEIGHTS` up to its ceiling, each checked by one call against calls of `MEASURED_ROWS` rows: `_ceiling`): a
  taller call is cut into calls of those heights, its last piece padded up to the next one where that wastes little,
  so a prefill's and a trainer's rows are computed as a decoding step's are (a bfloat16 GEMM was seen to sum a row
  otherwise in calls of 33 rows and more), in a few calls, each reading the weight once, not one per 32 rows.
What was chosen for each key is kept for `chosen_paths()` (the bench shows why the mode costs what it costs).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .measured_store import Kept, store
from .measuring import say

# The dispatch keys replacements are registered for: the mechanism is not CPU-specific.
DEVICE_KEYS = ("CPU", "CUDA")
_CPU_TILE_ROWS = 16
# Kernel launches cost more than padding on a GPU: taller tiles there.
_GPU_TILE_ROWS = 64
# The tallest call measured at every height and place (`_keeps_rows_from`); a taller one is made only at the heights
# `_ceiling` checks, else cut into calls of this height.
MEASURED_ROWS = 32


def tile_rows(device: torch.device) -> int:
    """The fixed call height every row is computed in on `device`."""
    return _CPU_TILE_ROWS if device.type == "cpu" else _GPU_TILE_ROWS


RowsFn = Callable[[torch.Tensor], torch.Tensor]  # rows of the row operand -> those rows of the result
Path = tuple[str, RowsFn]  # a way to compute it, by name: "library" (the op itself), "onednn"...


@dataclass(frozen=True)
class ChosenPath:
    """How the mode computes the rows of one kind of call on this machine (`by_rows`' choice)."""

    key: tuple  # the computation, its dtype, the shape and layout of all but the rows, the device type, the thread
    # count
    path: str  # the path's name
    height: int | None  # the row-keeping height it is padded to; None: tiles of `tile_rows` rows
    heights: dict[str, int | None]  # each path's row-keeping height as measured (None: none up to 16, or it failed)
    failed: tuple[str, ...] = ()  # the paths that could not run here (a kernel this CPU lacks)
    # the tallest call made: a taller one is cut into calls of the heights checked; None: any height, one call
    ceiling: int | None = MEASURED_ROWS
    unneeded: tuple[str, ...] = ()  # paths measured only below the chosen one's height (not taken from it up)


# (key, dtype, shape and layout of everything but the rows, device type, threads, calls) -> the path taken (its
# index) and its row-keeping height
_measured: dict[tuple, tuple[int, int | None, int]] = {}
_chosen: dict[tuple, ChosenPath] = {}
_measured_lock = threading.Lock()


def _padded(rows: torch.Tensor, height: int, dim: int) -> torch.Tensor:
    missing = height - rows.shape[dim]
    if missing == 0:
        return rows
    return torch.nn.functional.pad(rows, (0, 0) * (rows.dim() - 1 - dim) + (0, missing))  # one call, zeros after


def by_rows(
    a: torch.Tensor,
    dim: int,
    key: tuple,
    library: RowsFn,
    others: Callable[[], Sequence[Path]] = tuple,
    **choice,
) -> torch.Tensor:
    """The computation `library` does (and `others()` can do another way: each path named) on `a`, with every row
    of `a` (along `dim`) getting the bits it gets in a call of one fixed height: through the path measured to keep
    rows from the smallest height, a shorter call padded to that height; where none does, the library in tiles of
    the fixed height. `key` names the computation (the operation and its other operands). `others` is called
    only where it is measured or taken: on the way of every call, the library costs a lookup. `choice`: the rest of
    `choose`'s arguments (the first path's name, a decoding step's path, the library first)."""
    if a.shape[dim] == 0:
        return library(a)
    return in_rows(a, dim, *choose(a, dim, key, library, others, **choice))


def choose(
    a: torch.Tensor,
    dim: int,
    key: tuple,
    library: RowsFn,
    others: Callable[[], Sequence[Path]] = tuple,
    name: str = "library",
    library_first: bool = False,
    operand: torch.Tensor | None = None,
) -> tuple[RowsFn, int | None, int]:
    """`by_rows`' choice for calls like this one: (the path's function, the height it keeps rows from, None: tiles of
    the library; the tallest call it makes), measured once per key, dtype, shape and layout of all but the rows, and
    thread count.
    `operand`: the [..., K, N] tensor the rows multiply, where they do (`_probe` makes rows whose sums show any
    change of order with it)."""
    key = _full_key(a, dim, key)
    known = _measured.get(key)  # a dict read needs no lock
    if known is None:
        paths = [(name, library), *others()]
        known = _kept_answer(a, dim, key, paths, operand) or _row_keeping_path(
            a, dim, key, paths, library_first, operand
        )
    chosen, floor, ceiling = known
    return (library if chosen == 0 else others()[chosen - 1][1]), floor, ceiling


def _full_key(a: torch.Tensor, dim: int, key: tuple) -> tuple:
    """`key` with what else decides a call's kernels: the dtype, the shape and layout of all but the rows, the device
    type (a model split across devices has the same shapes on CPU and CUDA) and the thread count (the library blocks
    a call by it, and it is per thread: the app's workers run with one core fewer than the main thread)."""
    return (key, a.dtype, a.shape[:dim], a.shape[dim + 1 :], a.stride(-1) == 1, a.device.type, torch.get_num_threads())


def record_any_height(a: torch.Tensor, dim: int, key: tuple, name: str) -> None:
    """For `chosen_paths`: calls like `a` of `key` are computed by `name`, a kernel that gives a row the same bits in
    a call of any height by construction (nothing measured, nothing padded or cut)."""
    full = _full_key(a, dim, key)
    with _measured_lock:
        _chosen[full] = ChosenPath(full, name, 1, {name: 1}, ceiling=None)


def in_rows(
    a: torch.Tensor, dim: int, compute: RowsFn, floor: int | None, ceiling: int = MEASURED_ROWS
) -> torch.Tensor:
    """`compute(a)` with every row of `a` as in a call of `floor` to `MEASURED_ROWS` rows: a call of that height, or
    of one of `TALL_HEIGHTS` up to `ceiling` (checked to give the same rows), whole; a shorter one padded to the
    floor, a taller one cut into calls of those heights (`_next_piece`); with no floor, in tiles of the fixed
    height."""
    m = a.shape[dim]
    if floor is not None:
        if floor <= m <= MEASURED_ROWS or (m <= ceiling and m in TALL_HEIGHTS):
            return compute(a)
        if m < floor:
            return _compact(compute(_padded(a, floor, dim)).narrow(dim, 0, m), dim)
        pieces, start = [], 0
        while start < m:
            left = m - start
            height = _next_piece(left, ceiling)
            piece = a.narrow(dim, start, min(height, left))
            if height > left and left > MEASURED_ROWS:  # the last piece, padded up to a height checked
                pieces.append(compute(_padded(piece, height, dim)).narrow(dim, 0, left))
            else:
                pieces.append(in_rows(piece, dim, compute, floor, ceiling))
            start += height
        if len(pieces) == 1:  # one call padded up (a prefill of 60 rows at 64): no copy of its rows
            return _compact(pieces[0], dim)
        return torch.cat(pieces, dim=dim)
    height = tile_rows(a.device)
    if m <= height:
        return _compact(compute(_padded(a, height, dim)).narrow(dim, 0, m), dim)
    tiles = [compute(_padded(a.narrow(dim, s, min(height, m - s)), height, dim)) for s in range(0, m, height)]
    return torch.cat(tiles, dim=dim).narrow(dim, 0, m)


def _compact(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """A call's rows cut from a padded call, compact (a leading cut of a compact result is already)."""
    return rows if dim == 0 and rows.is_contiguous() else rows.clone()


def _next_piece(left: int, ceiling: int) -> int:
    """The height of the next call for `left` rows of a tall call: `left` itself where that is a height the path
    keeps rows at (at most `MEASURED_ROWS`, or one of `TALL_HEIGHTS` up to `ceiling`); else the next height up where
    padding to it wastes at most a quarter of the rows, else the largest height below."""
    if left <= MEASURED_ROWS:
        return left
    heights = [MEASURED_ROWS, *(h for h in TALL_HEIGHTS if h <= ceiling)]
    if left in heights:
        return left
    up = next((h for h in heights if h > left), None)
    if up is not None and up - left <= left // 4:
        return up
    return max(h for h in heights if h < left)


# The size of the terms that cancel in a probe's ordered rows, by the accumulator's precision: large enough that
# the small terms' rounding against them shows in the result's own dtype, small enough for the dtype's range.
_CANCELLING = {torch.float16: 2.0**14, torch.float64: 2.0**48}
_CANCELLING_DEFAULT = 2.0**24  # bfloat16 and float32, accumulated in float32


def _probe(a: torch.Tensor, dim: int, operand: torch.Tensor | None) -> torch.Tensor:
    """67 rows like `a`'s to measure a path on: even rows random, odd rows random with two large terms that cancel
    exactly in one output (each row its own output and pair of positions). A kernel that sums a row in another order
    in a call of another height rounds the small terms otherwise against the large ones, and it shows: on random
    rows alone, a bfloat16 result hides a float32 accumulator's other order almost always (1 row in 800 showed it).
    With `operand` ([..., K, N], what the rows multiply; its first matrix), the terms cancel in the products."""
    shape = list(a.shape)
    shape[dim] = 67
    probe = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    k = shape[-1]
    if k < 2 or not a.is_floating_point():
        return probe.to(a.dtype)
    big = _CANCELLING.get(a.dtype, _CANCELLING_DEFAULT)
    rows = probe.movedim(dim, -2).reshape(-1, 67, k)[0]  # the first matrix's rows (a view of the probe)
    # (the few weights read one by one, as they are: a copy of a 151,936-row head in float64 cost a second a probe)
    weights = None if operand is None else operand.reshape(-1, *operand.shape[-2:])[0]
    # the two terms near and far apart: a kernel that sums a row in blocks cancels a pair inside one block alike
    gaps = sorted({1, k // 4 or 1, k // 2 or 1, (3 * k) // 4 or 1, k - 1})
    for r in range(1, 67, 2):
        i = (r * 7) % k
        j = (i + gaps[(r // 2) % len(gaps)]) % k
        if weights is None:  # a sum of the row itself
            rows[r, i], rows[r, j] = big, -big
            continue
        c = r % weights.shape[1]
        wi, wj = weights[i, c].item(), weights[j, c].item()
        if wi == 0 or wj == 0 or not math.isfinite(wi * wj):  # (a NaN or infinite weight cancels nothing)
            continue
        scale = 2.0 ** (math.floor(math.log2(big)) - math.ceil(math.log2(max(abs(wi), abs(wj)))))
        rows[r, i], rows[r, j] = scale * wj, -scale * wi
    return probe.to(a.dtype)


# The call heights tried, smallest first: a library often takes other kernels for one row or a few.
_FLOORS = (1, 2, 4, 8, 16)


def forget_measured() -> None:
    """Every answer of this process dropped: the kernels they were measured on are no longer the ones registered."""
    with _measured_lock:
        _measured.clear()
        _chosen.clear()


def chosen_paths() -> list[ChosenPath]:
    """Every kind of call the mode has computed by rows in this process, and how."""
    with _measured_lock:
        return list(_chosen.values())


def _row_keeping_path(
    a: torch.Tensor,
    dim: int,
    key: tuple,
    paths: Sequence[Path],
    library_first: bool,
    operand: torch.Tensor | None,
) -> tuple[int, int | None, int]:
    """(which path, its height h): the path that, measured once per key on random rows, gives every row of a call
    of h or more rows the bits that row gets in a call of exactly h rows (wherever it sits) from the smallest h
    (the first on a tie); h None when no path keeps rows even from 16 rows, and always on CUDA, where the library
    picks kernels per shape (then: the first path that runs, in fixed-height tiles). A path that fails here is not
    taken. With `library_first`, the library wherever it keeps rows."""
    with torch.no_grad():  # measured on a probe, whatever the calling pass records
        return _measure_paths(a, dim, key, paths, library_first, operand)


def _measure_paths(a, dim, key, paths, library_first, operand) -> tuple[int, int | None, int]:
    heights: dict[str, int | None] = dict.fromkeys((name for name, _ in paths), None)
    failed: set[str] = set()
    probe = _probe(a, dim, operand) if a.device.type == "cpu" else None
    unneeded: list[str] = []
    if probe is not None:
        say(described(key))
        for name, compute in paths:
            # past the first, a path is measured only below the fewest rows another keeps them from (it is taken
            # only for fewer), but where the library comes first: its own height is needed
            found = [h for h in heights.values() if h is not None]
            below = min(found) if found and not library_first else None
            heights[name] = _measured_height(probe, dim, compute, name, failed, below)
            if below is not None and heights[name] is None and name not in failed:
                unneeded.append(name)
    floors = {i: height for i, (name, _) in enumerate(paths) if (height := heights[name]) is not None}
    library = next((i for i, (name, _) in enumerate(paths) if name == "library"), None)
    if floors:  # the smallest height, the first path on a tie
        index = min(floors, key=lambda i: (floors[i], i))
        if library_first and library in floors:  # not another kernel for less padding
            index = library if floors[library] > floors[index] else index
    else:  # none keeps rows: tiles, through the first path that runs here
        index = next((i for i, (name, _) in enumerate(paths) if name not in failed), 0)
    best = floors.get(index)
    name = paths[index][0]
    if best is None:
        ceiling = MEASURED_ROWS
    else:
        assert probe is not None  # a height is measured on the probe
        ceiling = _ceiling(probe, dim, paths[index][1], best)
    kept = Kept(name, best, ceiling, heights, tuple(sorted(failed)), tuple(unneeded))
    if probe is not None:  # (on CUDA nothing is measured: tiles)
        store.put(_stored_key(key), kept)
    return _taken(key, index, kept)


def _taken(key: tuple, index: int, kept: Kept) -> tuple[int, int | None, int]:
    """The answer for `key` kept for this process (and `chosen_paths`): (the path's index, its floor, the ceiling)."""
    with _measured_lock:  # two threads measuring one key find the same
        _chosen[key] = ChosenPath(
            key, kept.path, kept.floor, kept.heights, kept.failed, kept.ceiling, kept.unneeded
        )
        _measured[key] = (index, kept.floor, kept.ceiling)
    return index, kept.floor, kept.ceiling


def _kept_answer(a, dim, key, paths, operand) -> tuple[int, int | None, int] | None:
    """The answer the measurements file keeps for `key` (`measured_store`), where it names these paths and the path
    still keeps rows as it says (`_still_keeps`); None where it must be measured."""
    if a.device.type != "cpu":
        return None
    kept = store.get(_stored_key(key))
    for notice in store.take_notices():
        say("", notice=notice)
    names = [name for name, _ in paths]
    if kept is None or kept.path not in names or set(kept.heights) != set(names):
        return None
    index = names.index(kept.path)
    if kept.floor is not None:
        with torch.no_grad():
            if not _still_keeps(_probe(a, dim, operand), dim, paths[index][1], kept.floor, kept.ceiling):
                return None
    return _taken(key, index, kept)


def _stored_key(key: tuple) -> tuple:
    """`key` as the measurements file keeps it: with how it was measured (the heights tried, the tallest call), so
    that an answer measured otherwise is never taken."""
    return (key, _FLOORS, MEASURED_ROWS, TALL_HEIGHTS)


def _still_keeps(probe: torch.Tensor, dim: int, compute: RowsFn, floor: int, ceiling: int) -> bool:
    """Three calls that a path keeping rows from `floor`, as measured, gives alike: the first and the last row of a
    `MEASURED_ROWS` call as in `floor`-row calls. Cheap (three calls against a hundred measuring, none tall: on a
    head of 150,000 rows a tall one is seconds); a kept answer that fails it is measured again. (What decides the
    tall calls, the machine and its kernels, is the file's key.)"""
    tall = compute(probe.narrow(dim, 0, MEASURED_ROWS))
    last = MEASURED_ROWS - 1
    return torch.equal(tall.narrow(dim, 0, floor), compute(probe.narrow(dim, 0, floor))) and torch.equal(
        tall.narrow(dim, last, 1), compute(probe.narrow(dim, last, floor)).narrow(dim, 0, 1)
    )


def described(key: tuple) -> str:
    """A kind of call in a few words: `linear 1536x8960 bfloat16` (the op, its other operand's sizes, the dtype)."""
    call, dtype = key[0], key[1]
    op = call[0] if isinstance(call, tuple) and call else str(call)
    sizes = next((part for part in (call[1:] if isinstance(call, tuple) else ()) if isinstance(part, torch.Size)), None)
    shape = f" {'x'.join(map(str, sizes))}" if sizes else ""
    return f"{op}{shape} {str(dtype).removeprefix('torch.')}"


# The heights above `MEASURED_ROWS` a path may be checked to keep rows at, each with one call (so a tall call is
# made at one of them), and the time the checks of one kind of call may take: a height past it is not checked (the
# bits are the same whatever the ceiling: only the number of calls changes).
TALL_HEIGHTS = (48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
_TALL_BUDGET_S = 1.5


def _ceiling(probe: torch.Tensor, dim: int, compute: RowsFn, floor: int) -> int:
    """The tallest of `TALL_HEIGHTS` up to which every one gives every row of a call of that height the bits it gets
    in calls of `MEASURED_ROWS` rows, checked in order and stopped at the first that does not (a bfloat16 GEMM by a
    704-wide weight summed rows otherwise in 222 of the heights from 33 to 512, by 256-wide weights in none), or once
    the checks took `_TALL_BUDGET_S`; `MEASURED_ROWS` where none does. Rows of a 2-D call only (its row's bits
    depend on the call's shape alone, not on what the other rows hold: one call a height checks every place)."""
    if dim != 0 or probe is None or probe.dim() != 2:
        return MEASURED_ROWS
    rows = torch.cat([probe] * -(-max(TALL_HEIGHTS) // probe.shape[0]))
    started = time.perf_counter()
    best = MEASURED_ROWS
    for height in TALL_HEIGHTS:
        tall = rows[:height]
        if not torch.equal(compute(tall), in_rows(tall, 0, compute, floor, MEASURED_ROWS)):
            break
        best = height
        if time.perf_counter() - started > _TALL_BUDGET_S:
            break
    return best


def _measured_height(
    probe: torch.Tensor, dim: int, compute: RowsFn, name: str, failed: set[str], below: int | None = None
) -> int | None:
    """The smallest height from which `compute` keeps rows (None: not up to 16, or not below `below`, where another
    path keeps them from that many already); a path that cannot run here is added to `failed`."""
    try:
        compute(probe)  # runs here at all?
        floors = [h for h in _FLOORS if below is None or h < below]
        return next((h for h in floors if _keeps_rows_from(h, probe, dim, compute)), None)
    except RuntimeError:  # a kernel this CPU lacks (oneDNN's bf16 without AVX-512, or float64)
        failed.add(name)
        return None


def _keeps_rows_from(height: int, probe: torch.Tensor, dim: int, compute: RowsFn) -> bool:
    """Does every row of calls of `height` to `MEASURED_ROWS` rows get the bits it gets first in a `height`-row
    call? (Measured at every position: a GEMM's edge tiles and its thread split by rows may sum a row otherwise, and
    a tall call otherwise again: seen on bfloat16 from 64 rows, so no taller call is made.) The calls of each
    height are made first, then each row's own, row by row, up to the first that parts: on a large weight each
    call reads the whole weight, and a height that does not keep rows mostly shows it in its first rows."""
    heights = sorted({height, height + 1, height + 2, 2 * height + 1, 3 * height + 2, 17, MEASURED_ROWS - 1,
                      MEASURED_ROWS})  # fmt: skip
    calls = [compute(probe.narrow(dim, 0, rows)) for rows in heights if rows <= MEASURED_ROWS]
    for start in range(MEASURED_ROWS):
        own = compute(probe.narrow(dim, start, height)).narrow(dim, 0, 1)
        if not all(torch.equal(call.narrow(dim, start, 1), own) for call in calls if call.shape[dim] > start):
            return False
    return True
