"""Where the batch-invariant mode's cost on a model goes, in one process: a pass timed bare, in the whole mode and
with each of its classes alone.

    python scripts/invariant_parts.py [--model tiny] [--dtype float32] [--rounds 20] [--steps 30]

Runs from the repository root. Three passes: a decoding step of a text alone (60 tokens held), a decoding step of 8
left-padded texts of 20..140 tokens, and those 8 texts' prefills alone. Each is timed `--steps` times in a row, in
every configuration in turn, the order the same each round; each configuration's best round is printed with what
it adds to the bare pass. On a box whose speed differs by a tenth from one process to the next, and drifts within
one, a change of 20 µs a step is seen side by side and lost between two runs of `bench`. The classes' costs do
not add up to the whole mode's: each alone still pays the mode's entry into the pass.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the checkout's `batchtui.core`, installed or not

from batchtui.core.invariant.mode import batch_invariant  # noqa: E402
from batchtui.core.models.loading import load_model  # noqa: E402
from batchtui.core.settings import KERNEL_CLASSES, Settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    model = load_model(Settings(model=args.model, dtype=args.dtype)).model
    vocab = model.get_input_embeddings().weight.shape[0]
    passes = {"decode alone": _decoding_step(model, [60], vocab), "decode 8": _decoding_step(model, _lengths(), vocab)}
    passes["prefill alone x8"] = _prefills(model, _lengths(), vocab)
    modes = {"bare": contextlib.nullcontext, "mode": lambda: batch_invariant(model)}
    modes.update({name: (lambda name=name: batch_invariant(model, (name,))) for name in KERNEL_CLASSES})
    best = {(p, m): float("inf") for p in passes for m in modes}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for mode, enter in modes.items():
                with enter():
                    for name, run in passes.items():
                        run()  # warm: a first call in the mode measures its paths
                        started = time.perf_counter()
                        for _ in range(args.steps):
                            run()
                        best[name, mode] = min(best[name, mode], (time.perf_counter() - started) / args.steps)
    print(f"{args.model} {args.dtype}, {torch.get_num_threads()} threads, best of {args.rounds} rounds (µs a pass)")
    for name in passes:
        bare = best[name, "bare"]
        cells = [f"{mode} {1e6 * best[name, mode]:.0f} (+{1e6 * (best[name, mode] - bare):.0f})" for mode in modes]
        print(f"{name:17} " + "  ".join(cells))


def _lengths() -> list[int]:
    return torch.randint(20, 140, (8,), generator=torch.Generator().manual_seed(0)).tolist()


def _batch(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded token ids and mask, one position wider than the longest text (for its decoding step)."""
    width = max(lengths)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(len(lengths), width + 1, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return ids, mask


def _decoding_step(model, lengths: list[int], vocab: int):
    """One decoding step over the texts' prefill cache, the cache cut back after each."""
    ids, mask = _batch(lengths, vocab)
    width = ids.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        prefill = model(input_ids=ids, attention_mask=mask[:, :width], position_ids=positions[:, :width])
    token = torch.full((len(lengths), 1), 5)
    # transformers' newer models name the cache `cache` (`past_key_values` deprecated), the older ones only so
    named = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = getattr(prefill, named)

    def step() -> None:
        model(input_ids=token, attention_mask=mask, position_ids=positions[:, width:], **{named: cache})
        cache.crop(-1)

    return step


def _prefills(model, lengths: list[int], vocab: int):
    ids, _ = _batch(lengths, vocab)
    texts = [ids[row : row + 1, ids.shape[1] - length :] for row, length in enumerate(lengths)]
    return lambda: [model(input_ids=text) for text in texts]


if __name__ == "__main__":
    main()
