"""`bench`'s rollouts rows: `batchtui rollouts` on the bench's sampled (prompt, completion) pairs against the bare
batched forward of the same sequences in the same batches (the trainer's layout in training mode, autograd on, the
logits made and dropped): what reading, checking, planning, the logprobs, records and summary add to the forwards."""

from __future__ import annotations

import json
import os
import tempfile

import torch

from ..models.loading import LoadedModel
from ..rollouts.job import RolloutsJob
from ..rollouts.plan import DEFAULT_BATCH_TOKENS, batches
from ..rollouts.rollouts_file import RolloutFaults, read_rollouts
from ..rollouts.scoring import score_rollouts, vocabulary_of
from ..run.runner import position_ids
from ..run.trainer_forward import grpo_layout, training_without_dropout
from ..settings import Settings
from .figures import MoreMethods

ROLLOUTS_LIMIT = 1.2  # the scoring's time over the bare forwards'


def rollouts_methods(loaded: LoadedModel, pairs: list[tuple], settings: Settings) -> MoreMethods:
    """The two methods (the scoring with records, and the bare forwards of its plan) and their ratio."""
    folder = tempfile.TemporaryDirectory(prefix="batchtui-bench-")  # removed with the methods
    path = os.path.join(folder.name, "rollouts.jsonl")
    with open(path, "w") as out:
        for prompt, completion in pairs:  # (the sampler's logprobs do not change what the scoring costs)
            line = {"prompt_ids": prompt, "completion_ids": completion, "logprobs": [-1.0] * len(completion)}
            out.write(json.dumps(line) + "\n")
    records = os.path.join(folder.name, "records.jsonl")
    job = RolloutsJob(path, settings, DEFAULT_BATCH_TOKENS, records)
    rollouts = read_rollouts(path, vocabulary_of(loaded), RolloutFaults(skip_bad=False))
    plan = [
        grpo_layout([list(r.prompt_ids) for r in b.rollouts], [list(r.completion_ids) for r in b.rollouts],
                    loaded.pad_token_id, loaded.device)[:2]
        for b in batches(rollouts, job.batch_tokens)
    ]  # fmt: skip

    def scoring(_kept=folder) -> None:  # (the folder lives as long as the method)
        if os.path.exists(records):
            os.remove(records)
        score_rollouts(job)

    def bare() -> None:
        model = loaded.model
        with torch.inference_mode(False), torch.enable_grad(), training_without_dropout(model):
            for ids, mask in plan:
                model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask, "mask"), use_cache=False)

    return MoreMethods(
        {"rollouts_forward": bare, "rollouts": scoring},
        {"rollouts_vs_forward": ("rollouts", "rollouts_forward", ROLLOUTS_LIMIT)},
    )
