"""Which rollouts share a forward: batches cut by length, the same for every reader of the same file.

The file is read in windows of `WINDOW` rollouts (memory stays flat however long the file), each window's rollouts
sorted by prompt and completion length, then cut into batches whose padded size (rows times the longest prompt plus
the longest completion: the trainer's layout, `run.trainer_forward`) stays within `batch_tokens` (a rollout longer
than that is a batch of its own). The plan depends on the file and `batch_tokens` alone: a resumed run and every
rank of a torchrun meet the same batches in the same order, so a sequence's logprobs do not depend on how the run
was split or stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from .rollouts_file import Rollout

WINDOW = 1024
DEFAULT_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class Batch:
    index: int  # in the plan, from 0
    rollouts: tuple[Rollout, ...]


def batches(rollouts: Iterable[Rollout], batch_tokens: int) -> Iterator[Batch]:
    """The plan's batches in order."""
    index = 0
    source = iter(rollouts)
    while window := list(islice(source, WINDOW)):
        window.sort(key=lambda r: (len(r.prompt_ids), len(r.completion_ids), r.line))
        current: list[Rollout] = []
        prompt = completion = 0  # the longest of `current`
        for rollout in window:
            longer = max(prompt, len(rollout.prompt_ids)), max(completion, len(rollout.completion_ids))
            if current and (len(current) + 1) * sum(longer) > batch_tokens:
                yield Batch(index, tuple(current))
                index, current = index + 1, []
                longer = len(rollout.prompt_ids), len(rollout.completion_ids)
            current.append(rollout)
            prompt, completion = longer
        yield Batch(index, tuple(current))
        index += 1
