"""What four levers on a comparison's cost would buy, measured side by side in one process: the metrics' block size,
the texts measured together, the copy each hook makes and the invariant mode's tile height. Made for a GPU, where a
group, a block and a tile each cost a fixed set of kernel launches.

    python scripts/gpu_levers.py [--model tiny-qwen2.5-1.5b-shape] [--dtype bfloat16] [--rounds 5] [--blocks 2**25]
                                 [--groups 2,4] [--tiles 256,1024] [--new-tokens 8]

Runs from the repository root. For each block size (elements of float32 work measured at once, `block_elements`:
2**24 on a GPU now, 2**22 on the CPU), and for groups of texts measured once their rows fill 2 or 4 blocks (one now;
over a real vocabulary on a GPU a block holds about 110 rows, so a group is a text or two), on `bench`'s workload
(16 texts of 32..128 tokens): compare against the floor, best of interleaved rounds; whether its report is the
current one's digit for digit (it must be: blocks and groups only partition rows); and, on bench's memory workload
(32 texts of 256 tokens), compare's peak memory above the floor's in chunks of float32 logits, as `bench` reports it
(its target: 1.5). Then the passes recording hidden states as a comparison does, with and without the copy each hook
makes, against the bare passes: what the copy costs. (The copy keeps what a module returned where the model edits it
in place afterwards, as Falcon does; without it such a model's numbers would be wrong, so this measures the copy and
changes nothing.) Last, the batch-invariant mode with each tile height (the rows every matmul and reduction of a GPU
computes at once, `tile_rows`: 64 now; any fixed height keeps a row's bits whatever its batch, while a taller one
means fewer launches for a chunk and more padding for a short text or a decoding step): compare and generate in the
mode against compare and generate, best of interleaved rounds, and how many texts came out bitwise equal to their
single runs (all of them, at every height, or the height is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # the checkout's `batchtui.core`

from profile_compare import best_of, recorded_passes  # noqa: E402  (this script's folder comes first on the path)

from batchtui.core.bench.clock import peak_memory  # noqa: E402
from batchtui.core.bench.methods import floor_passes, workload  # noqa: E402
from batchtui.core.bench.targets import LARGE_VOCABULARY  # noqa: E402
from batchtui.core.invariant import rows as invariant_rows  # noqa: E402
from batchtui.core.models.loading import load_model  # noqa: E402
from batchtui.core.numbers import metrics  # noqa: E402
from batchtui.core.numbers.cpu_memory import keep_freed_memory  # noqa: E402
from batchtui.core.reports.report import to_json_dict  # noqa: E402
from batchtui.core.run import engine  # noqa: E402
from batchtui.core.run.generation_run import generate_and_compare  # noqa: E402
from batchtui.core.run.runner import Runner, module_output  # noqa: E402
from batchtui.core.settings import Settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2.5-1.5b-shape")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--blocks", help="block sizes to try beside the current one: 2**25,67108864")
    parser.add_argument(
        "--groups",
        default="2,4",
        type=lambda text: [int(n) for n in text.split(",")],
        help="texts measured together until their rows fill this many blocks, not one (blocks unchanged)",
    )
    parser.add_argument("--tiles", default="256,1024", help="GPU tile heights to try beside the current one")
    parser.add_argument("--new-tokens", type=int, default=8, help="greedy steps of the generate runs")
    args = parser.parse_args()
    keep_freed_memory()
    settings = Settings(model=args.model, dtype=args.dtype)
    loaded = load_model(settings)
    cuda = loaded.device.startswith("cuda")
    current = metrics.block_elements(loaded.device)
    others = [_elements(size) for size in args.blocks.split(",")] if args.blocks else [2 * current, 4 * current]
    blocks = [current] + [size for size in others if size != current]
    texts = workload(loaded.tokenizer, 16, 32, 128)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"{args.model} {loaded.dtype} on {loaded.device}, block_elements now {current}")

    # Each variant: a label and what runs a comparison under it (the first: as it is now).
    variants = {f"block {current}": lambda run: run}
    variants |= {f"block {size}": partial(_in_block, size) for size in blocks[1:]}
    variants |= {f"groups of {count} blocks": partial(_in_groups, count) for count in args.groups}
    methods = {"floor": lambda: floor_passes(loaded, texts, settings)}
    for label, variant in variants.items():
        methods[f"compare, {label}"] = variant(lambda: engine.compare(texts, settings))
    methods["recorded passes"] = lambda: recorded_passes(loaded, texts, settings)
    methods["recorded passes, no copies"] = _uncopied(lambda: recorded_passes(loaded, texts, settings))
    best = best_of(methods, args.rounds, sync)
    for name, seconds in best.items():
        print(f"{name:34} {1e3 * seconds:8.1f} ms  {seconds / best['floor']:.3f} of the floor")

    reports = {label: _report(variant, texts, settings) for label, variant in variants.items()}
    now = reports[f"block {current}"]
    for label, report in reports.items():
        if report is not now:
            print(f"{label}: the report is {'the same as' if report == now else 'NOT'} the current one's")

    long_texts = workload(loaded.tokenizer, 32, 256, 256)
    longest = max(len(loaded.tokenizer(text)["input_ids"]) for text in long_texts)
    chunk_logits = min(settings.batch_size, len(long_texts)) * longest * loaded.vocab_size * 4
    floor = peak_memory(lambda: floor_passes(loaded, long_texts, settings), loaded.device)
    if loaded.vocab_size < LARGE_VOCABULARY:
        print(f"(a vocabulary of {loaded.vocab_size}: hidden states outweigh logits, and bench sets no memory target)")
    for label, variant in variants.items():
        peak = peak_memory(variant(lambda: engine.compare(long_texts, settings)), loaded.device)
        print(f"{label}: memory above the floor's {(peak - floor) / chunk_logits:.3f} chunks of float32 logits")

    if cuda:
        heights = [int(height) for height in args.tiles.split(",")]
        _tile_heights(texts, settings, heights, max(2, args.rounds // 2), args.new_tokens, sync)
    else:
        print("(the CPU's tiles are measured per shape, not set: the tile lever is a GPU's)")


def _tile_heights(texts: list[str], settings: Settings, others: list[int], rounds: int, new_tokens: int, sync) -> None:
    """compare and generate in the invariant mode at each tile height, against compare and generate."""
    current = invariant_rows.tile_rows(torch.device("cuda"))
    heights = [current] + [height for height in others if height != current]
    invariant = settings.with_changes(invariant=True)
    methods = {
        "compare": lambda: engine.compare(texts, settings),
        "generate": lambda: generate_and_compare(texts, settings, new_tokens),
    }
    for height in heights:
        methods[f"compare invariant, tiles {height}"] = _in_tiles(height, lambda: engine.compare(texts, invariant))
        methods[f"generate invariant, tiles {height}"] = _in_tiles(
            height, lambda: generate_and_compare(texts, invariant, new_tokens)
        )
    best = best_of(methods, rounds, sync)
    for name, seconds in best.items():
        base = best["generate" if name.startswith("generate") else "compare"]
        print(f"{name:34} {1e3 * seconds:8.1f} ms  {seconds / base:.3f} of {name.split()[0]}")
    for height in heights:
        compared = _in_tiles(height, lambda: engine.compare(texts, invariant))()
        generated = _in_tiles(height, lambda: generate_and_compare(texts, invariant, new_tokens))()
        logits = sum(text.bitwise_equal for text in compared.texts)
        steps = sum(text.bitwise_equal for text in generated.texts)
        print(
            f"tiles {height}: bitwise {logits}/{len(compared.texts)} texts (logits), {steps}/{len(generated.texts)} "
            "(every generate step)"
        )


def _elements(size: str) -> int:
    base, _, power = size.strip().partition("**")
    return int(base) ** int(power) if power else int(base)


def _patched(run, *changes):
    """`run` with each (owner, name, value) of `changes` set while it runs, and put back after."""

    def patched():
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
        for owner, name, value in changes:
            setattr(owner, name, value)
        try:
            return run()
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    return patched


def _in_block(elements: int, run):
    """`run` with `block_elements` giving `elements` (where the engine groups texts and the metrics cut blocks)."""
    block = lambda device: elements  # noqa: E731
    return _patched(run, (metrics, "block_elements", block), (engine, "block_elements", block))


def _in_groups(count: int, run):
    """`run` with a group of texts measured once its rows fill `count` metrics blocks, not one (each block still
    measured as one; on a GPU a group's own ops, its gathers, layer sums and results, are a fixed set of launches)."""
    rows = lambda device, vocab: count * metrics.block_rows(device, vocab)  # noqa: E731
    return _patched(run, (engine, "block_rows", rows))


def _in_tiles(height: int, run):
    """`run` with the invariant mode computing every GPU row in calls of `height` rows."""
    return _patched(run, (invariant_rows, "_GPU_TILE_ROWS", height))


def _uncopied(run):
    """`run` with each hook keeping the module's output itself, not a copy of it."""

    def capture(self, name, module, args, output):
        self._captured[name] = module_output(output)

    return _patched(run, (Runner, "_capture", capture))


def _report(variant, texts: list[str], settings: Settings) -> str:
    comparison = variant(lambda: engine.compare(texts, settings))()
    return json.dumps({k: v for k, v in to_json_dict(comparison).items() if k != "elapsed_s"}, sort_keys=True)


if __name__ == "__main__":
    main()
