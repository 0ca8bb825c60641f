"""What the batch-invariant mode removed from a rollouts run: the trainer's own batch noise.

Without the mode a sequence's trainer logprobs depend on the batch it is scored in (the GEMMs' blocking, the padding);
the mode removes that, not the sampler's kernels (a server's). So that a newcomer reads what the mode did, a run with
`--invariant` scores the plan's first batch again, without the mode and with it, in its batch and each sequence
alone, and says how many tokens moved between the two batchings each way (`numbers.rollouts_summary.BatchNoise`).
"""

from __future__ import annotations

from ..invariant.mode import invariant_if
from ..numbers.rollouts_summary import BatchNoise
from ..run.trainer_forward import DEFAULT, TrainerCall, scored_in_training, trainer_modes
from .plan import Batch

# The sequences scored again (of the first batch), each twice each way: a few forwards, whatever the file's size.
NOISE_SEQUENCES = 16


def batch_noise(
    model, batch: Batch, pad_id: int, temperature: float, classes: tuple[str, ...], call: TrainerCall = DEFAULT
) -> BatchNoise:
    rollouts = batch.rollouts[:NOISE_SEQUENCES]
    prompts = [list(r.prompt_ids) for r in rollouts]
    completions = [list(r.completion_ids) for r in rollouts]

    def moves(invariant: bool) -> list[float]:
        """|Δ| of every token between its batch and alone, where the two are not the same bits (0 where they are)."""
        with invariant_if(invariant, model, classes), trainer_modes(model):
            together = scored_in_training(model, prompts, completions, pad_id, temperature, call=call)
            alone = [
                scored_in_training(model, [p], [c], pad_id, temperature, call=call)[0]
                for p, c in zip(prompts, completions)
            ]
        return [
            abs(a - b) if a != b else 0.0
            for t, s in zip(together, alone)
            for a, b in zip(t.logprobs.tolist(), s.logprobs.tolist())
        ]

    plain, in_mode = moves(False), moves(True)
    return BatchNoise(
        lines=tuple(r.line for r in rollouts),
        tokens=len(plain),
        moved=sum(move > 0 for move in plain),
        max_abs_diff=max(plain, default=0.0),
        moved_in_mode=sum(move > 0 for move in in_mode),
    )
