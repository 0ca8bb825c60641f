"""`batchtui probe`: one Linear layer, row 0 of a batch vs the same row alone (the seed answer's test).

For each dtype, layer size and batch size N, R repeats with fresh seeded inputs and weights:
how often row 0 of the batch is bitwise equal and allclose to the batch-of-one result, the
largest difference, and whether repeating the very same computation gives the very same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ResourceError, is_out_of_memory
from ..settings import LOW_PRECISION_GRID

SIZES = (256, 512, 1024, 1536, 2048, 4096)
BATCH_SIZES = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ProbeCell:
    dtype: str
    size: int
    batch_size: int
    repeats: int
    bitwise_equal: int  # of `repeats`
    allclose: int
    max_abs_diff: float  # over the repeats
    repeatable: bool  # the same inputs twice gave the same bits, batched and alone


def probe_cell(
    dtype: str, size: int, batch_size: int, repeats: int, device: str, atol: float, rtol: float
) -> ProbeCell:
    equal = close = 0
    worst = 0.0
    repeatable = True
    generator = torch.Generator(device="cpu")
    for repeat in range(repeats):
        generator.manual_seed(hash((size, batch_size, repeat)) & 0xFFFF_FFFF)
        x = torch.randn(batch_size, size, generator=generator).to(device, getattr(torch, dtype))
        weight = (torch.randn(size, size, generator=generator) / size**0.5).to(device, getattr(torch, dtype))
        bias = torch.randn(size, generator=generator).to(device, getattr(torch, dtype))
        alone = torch.nn.functional.linear(x[:1], weight, bias)[0]
        batched = torch.nn.functional.linear(x, weight, bias)[0]
        equal += torch.equal(alone, batched)
        close += torch.allclose(alone, batched, atol=atol, rtol=rtol)
        worst = max(worst, (alone.float() - batched.float()).abs().max().item())
        again_alone = torch.nn.functional.linear(x[:1], weight, bias)[0]
        again_batched = torch.nn.functional.linear(x, weight, bias)[0]
        repeatable &= torch.equal(alone, again_alone) and torch.equal(batched, again_batched)
    return ProbeCell(dtype, size, batch_size, repeats, equal, close, worst, repeatable)


def probe(
    sizes=SIZES,
    batch_sizes=BATCH_SIZES,
    dtypes=LOW_PRECISION_GRID,
    repeats: int = 3,
    device: str = "cpu",
    atol: float = 1e-5,
    rtol: float = 1e-3,
    progress: Callable[[int, int], None] | None = None,
) -> list[ProbeCell]:
    grid = [(d, s, n) for d in dtypes for s in sizes for n in batch_sizes]
    cells = []
    with torch.inference_mode():
        for done, (dtype, size, n) in enumerate(grid, start=1):
            try:
                cells.append(probe_cell(dtype, size, n, repeats, device, atol, rtol))
            except RuntimeError as exc:
                if not is_out_of_memory(exc):
                    raise
                raise ResourceError(
                    f"out of memory on {device} for a {size}x{size} {dtype} layer with {n} rows: use smaller --sizes"
                ) from None
            if progress is not None:
                progress(done, len(grid))
    return cells
