"""The mode's Triton kernels on a lent GPU: does a row keep its bits at every height, and what does a call cost
against the library's (cuBLAS `F.linear`, SDPA) on the 1.5B shape's layers? Prints one JSON object.

    python scripts/triton_check.py [--dtype bfloat16] [--out triton-check.json]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F

from batchtui.core.invariant.gpu_kernels import triton_kernels
from batchtui.core.invariant.measuring import listen

# (in, out) of the 1.5B shape's linear layers: q, k/v, o, gate/up, down, the head
LAYERS = [(1536, 1536), (1536, 256), (1536, 8960), (8960, 1536), (1536, 151936)]
ROWS = [1, 8, 64, 512, 2048]
ATTENTION = [(1, 1), (8, 1), (8, 128), (8, 1024), (1, 4096)]  # (batch, queries): 12 heads over 2 of 128


def _ms(fn, repeats: int = 20) -> float:
    """Median milliseconds of `fn` on the GPU (events around each call, after two to warm it)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _timed(ours, library, **row) -> dict:
    """`row` with both calls' median milliseconds and their ratio, printed as it is found."""
    row.update(ms=_ms(ours), library_ms=_ms(library))
    row["ratio"] = round(row["ms"] / row["library_ms"], 3)
    print(json.dumps(row), flush=True)
    return row


def _linear(kernels, dtype, rows: int, inputs: int, outputs: int) -> dict:
    weight = torch.randn(outputs, inputs, device="cuda", dtype=dtype) / inputs**0.5
    x = torch.randn(rows, inputs, device="cuda", dtype=dtype)
    ours = functools.partial(kernels.fixed_order_matmul, x, weight.t())
    library = functools.partial(F.linear, x, weight)
    whole = ours()
    kept = all(torch.equal(kernels.fixed_order_matmul(x[i : i + 1], weight.t()), whole[i : i + 1])
               for i in (0, rows // 2, rows - 1))  # fmt: skip
    exact = x.double() @ weight.double().t()
    error = (whole.double() - exact).abs().mean().item()
    library_error = (library().double() - exact).abs().mean().item()
    shape = [rows, inputs, outputs]
    return _timed(ours, library, shape=shape, rows_kept=kept, error=error, library_error=library_error)


def _attention(kernels, dtype, batch: int, queries: int) -> dict:
    keys = 512 if queries == 1 else queries  # a decoding step over a cache of 512
    q = torch.randn(batch, 12, queries, 128, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, 2, keys, 128, device="cuda", dtype=dtype) for _ in range(2))
    counts = torch.arange(keys - queries + 1, keys + 1, device="cuda").view(1, 1, queries).expand(batch, 12, queries)
    starts = torch.zeros(batch, queries, dtype=torch.long, device="cuda")
    ours = functools.partial(kernels.ordered_attention_gpu, q, k, v, kernels.query_tiles(starts), counts, 128**-0.5,
                             None, None, None)  # fmt: skip
    mask = torch.ones(queries, keys, dtype=torch.bool, device="cuda").tril(keys - queries)
    library = functools.partial(F.scaled_dot_product_attention, q, k.repeat_interleave(6, 1),
                                v.repeat_interleave(6, 1), attn_mask=mask)  # fmt: skip
    last = kernels.ordered_attention_gpu(q[:, :, -1:], k, v, kernels.query_tiles(starts[:, -1:]), counts[:, :, -1:],
                                         128**-0.5, None, None, None)  # fmt: skip
    kept = torch.equal(last, ours()[:, :, -1:])
    return _timed(ours, library, batch=batch, queries=queries, keys=keys, decode_step_kept=kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--out", default="triton-check.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    listen(lambda event: event.notice and print(event.notice, flush=True))
    kernels = triton_kernels(torch.zeros(1, device="cuda", dtype=dtype))
    if kernels is None:
        raise SystemExit("the Triton kernels are not taken on this GPU (the line above says why)")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype,
              "linear": [_linear(kernels, dtype, rows, *layer) for layer in LAYERS for rows in ROWS],
              "attention": [_attention(kernels, dtype, *case) for case in ATTENTION]}  # fmt: skip
    with open(args.out, "w") as file:
        json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
