"""The mode's compiled CPU kernels alone against the library's calls on a model's shapes, side by side in one process.

    python scripts/compiled_kernel_timings.py [--model tiny] [--dtype float32] [--calls 200] [--rows 8,160,1300]

Runs from the repository root. Each linear layer's weight (from the model's config: its attention's and MLP's
projections and its head) at a decoding step's 8 rows, a prefill's 160 and a batch's 1,300 (`--rows`), through the
compiled kernel and through `F.linear`; the attention (the config's heads, key heads and head size) over 8 rows of
160 causal tokens, one text of 160 and a decoding step of 8 rows over 170 keys, through the compiled kernel and
through SDPA. Printed: microseconds a call (the best of three runs of `--calls` calls each) and the kernel's over the
library's. Set `BATCHTUI_KERNELS_MARCH=x86-64-v3` (and `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`) for what an AVX2-only CPU runs, and a fresh `XDG_CACHE_HOME` to build the kernels anew.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.nn.functional import linear, scaled_dot_product_attention

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the checkout's `batchtui.core`, installed or not

from batchtui.core.invariant.compiled_kernels import compiled_attention, compiled_linear  # noqa: E402
from batchtui.core.models.builtin import builtin_path  # noqa: E402


def best_us(calls: int, op, *operands) -> float:
    op(*operands)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            op(*operands)
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", default="8,160,1300", help="the linear layers' rows, comma-separated ('': none)")
    args = parser.parse_args()
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(builtin_path(args.model) if "/" not in args.model else args.model)
    dtype, threads = getattr(torch, args.dtype), torch.get_num_threads()
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    hidden, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    print(f"{args.model} {args.dtype}, {threads} threads; microseconds a call: kernel, library, kernel / library")
    for n, k in sorted({(heads * d, hidden), (hidden, heads * d), (inner, hidden), (hidden, inner), (vocab, hidden)}):
        weight = torch.randn(n, k, dtype=dtype)
        for m in [int(rows) for rows in args.rows.split(",") if rows]:
            x = torch.randn(m, k, dtype=dtype)
            op, out, none = compiled_linear(x), x.new_empty(m, n), x.new_empty(0)
            ours = best_us(args.calls, op, x, weight, none, threads, out)
            theirs = best_us(args.calls, linear, x, weight)
            print(f"linear {n}x{k}, {m} rows: {ours:.0f} {theirs:.0f} {ours / theirs:.2f}")
    for rows, queries, keys in ((8, 160, 160), (1, 160, 160), (8, 1, 170)):
        q = torch.randn(rows, heads, queries, d, dtype=dtype)
        k, v = (torch.randn(rows, kv_heads, keys, d, dtype=dtype) for _ in range(2))
        seen = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)[None, None]
        op, out = compiled_attention(q), q.new_empty(rows, heads, queries, d)
        none, calls = q.new_empty(0, dtype=torch.float32), max(1, args.calls // 4)
        visible = seen.expand(rows, heads, -1, -1)
        ours = best_us(calls, op, q, k, v, visible, none, none, d**-0.5, 0.0, threads, out)
        wide_k, wide_v = (t.repeat_interleave(heads // kv_heads, 1) for t in (k, v))
        theirs = best_us(calls, scaled_dot_product_attention, q, wide_k, wide_v, seen)
        print(f"attention {rows} rows, {queries} queries over {keys} keys: {ours:.0f} {theirs:.0f} {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
