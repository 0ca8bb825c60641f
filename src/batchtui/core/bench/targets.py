"""`bench`'s limits, each a ratio a comparison or the batch-invariant mode may cost at most, and the mode's matmul
paths in words a table shows."""

from __future__ import annotations

import torch

from ..models.loading import LoadedModel
from .figures import BenchResult

# Built-in models small enough that per-call overheads, not the passes, dominate their timings.
SMALL_BUILTINS = ("tiny", "qwen2-english-4m")
# The memory target is about logits of a real vocabulary (Qwen2.5: 151,936 tokens).
LARGE_VOCABULARY = 100_000

MATMULS = ("linear", "mm", "addmm", "bmm")


def weights_dtype(loaded: LoadedModel) -> torch.dtype:
    return next(loaded.model.parameters()).dtype


def path_row(chosen) -> dict:
    """One kind of matmul the mode computed, in words a table can show: the operand that is not the rows as
    [in, out] (a linear layer's weight transposed)."""
    (op, operand, *rest), dtype, _, _, _, _, threads = chosen.key
    if op == "linear":  # its weight as stored, [out, in]; and whether it adds a bias
        op, operand = ("linear+bias" if rest[0] else "linear"), (operand[1], operand[0])
    return {
        "op": op,
        "operand": "x".join(str(n) for n in operand),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads,
        "path": chosen.path,
        "height": chosen.height,
        "ceiling": chosen.ceiling,
        "heights": chosen.heights,
        "failed": list(chosen.failed),
        "unneeded": list(chosen.unneeded),
    }


def target(name: str, value: float, limit: float) -> dict:
    return {"name": name, "value": value, "limit": limit, "pass": value <= limit}


def targets_of(result: BenchResult, texts: list[str], loaded: LoadedModel) -> list[dict]:
    r = result.ratios
    # What a comparison adds to the passes it compares: a tenth on a model of a few million weights (whose forward
    # passes cost about what reading their logits does), a twentieth on a real model's shape; and never more
    # than the seed's own script, which compares nothing per position.
    targets = [
        target("compare_vs_floor", r["compare_vs_floor"], 1.10 if result.model in SMALL_BUILTINS else 1.05),
        target("compare_vs_seed", r["compare_vs_seed"], 1.0),
    ]
    if result.model in SMALL_BUILTINS:  # generate's per-step calls weigh more there too
        targets.append(target("generate_vs_floor", r["generate_vs_floor"], 1.25))
    else:
        targets += [
            target("modules_vs_floor", r["modules_vs_floor"], 1.30),
            target("generate_vs_floor", r["generate_vs_floor"], 1.15),
        ]
    # The same logits at a cost one leaves on, on every model and machine: ahead of the peers' batch-invariant modes
    # (1.34x to 2.4x) and close to the library.
    targets += [
        target("invariant_vs_compare", r["invariant_vs_compare"], 1.10),
        target("invariant_generate_vs_generate", r["invariant_generate_vs_generate"], 1.30),
        target("invariant_trainer_vs_trainer", r["invariant_trainer_vs_trainer"], 1.50),
        target("invariant_train_step_vs_train_step", r["invariant_train_step_vs_train_step"], 1.50),
    ]
    longest = max(len(loaded.tokenizer(t)["input_ids"]) for t in texts)
    chunk_logits = min(result.batch_size, len(texts)) * longest * result.vocab_size * 4
    extra = result.peak_bytes["compare"] - result.peak_bytes["floor"]
    result.ratios["memory_vs_chunk_logits"] = extra / chunk_logits
    if result.vocab_size >= LARGE_VOCABULARY:  # with a tiny vocabulary, hidden states outweigh logits
        targets.append(target("memory_vs_chunk_logits", extra / chunk_logits, 1.5))
    return targets
