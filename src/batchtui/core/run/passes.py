"""The passes a comparison adds per text when asked: the padded row alone (which splits batched-vs-single into
a batch effect and a padding effect) and the float64 reference on the CPU (is batching worse, or only other?)."""

from __future__ import annotations

import torch

from ..models.loading import LoadedModel, load_model
from ..numbers.comparison import Decomposition, ReferenceErrors
from ..numbers.metrics import max_abs_diff
from ..settings import Settings
from .backend import Backend, BatchedChunk, PassOutput
from .runner import Runner


def decomposition(backend: Backend, chunk: BatchedChunk, row: int, single: PassOutput, settings: Settings):
    """B vs P (row `row` of the padded chunk run as a batch of one) and P vs S."""
    batched = chunk.real_rows(chunk.output.logits, row)
    padded_logits = backend.padded_row(chunk, row).logits[0]
    padded = padded_logits[chunk.real_mask(row, padded_logits.device)]
    alone = single.logits[0]
    return Decomposition(
        batch_effect=max_abs_diff(batched, padded),
        padding_effect=max_abs_diff(padded, alone),
        batch_effect_allclose=torch.allclose(batched, padded, atol=settings.atol, rtol=settings.rtol),
        padding_effect_allclose=torch.allclose(padded, alone, atol=settings.atol, rtol=settings.rtol),
    )


def load_reference_model(settings: Settings) -> LoadedModel:
    """The same checkpoint in float64 on the CPU; kept loaded beside the main model."""
    return load_model(settings.with_changes(dtype="float64", device="cpu"))


def reference_errors(
    reference: LoadedModel, token_ids: list[int], chunk: BatchedChunk, row: int, single: PassOutput
) -> ReferenceErrors:
    """The batched and the single logits against R, the text alone in float64 on the CPU."""
    with Runner(reference, "left", "mask", record=False) as ref_runner:
        exact = ref_runner.single(token_ids).logits[0]
    batched = chunk.real_rows(chunk.output.logits, row).to("cpu", torch.float64)
    return ReferenceErrors(
        batched=max_abs_diff(batched, exact),
        single=max_abs_diff(single.logits[0].to("cpu", torch.float64), exact),
    )
