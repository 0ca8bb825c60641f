"""Past one process: the ranks of a torchrun (`torchrun --nproc-per-node N -m batchtui.core rollouts ...`), through
torch.distributed (gloo on CPUs, nccl on GPUs). Outside torchrun, one rank of one, with no process group."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

Value = TypeVar("Value")


@dataclass(frozen=True)
class Ranks:
    rank: int
    size: int

    @property
    def first(self) -> bool:
        return self.rank == 0

    def gathered(self, value: object) -> list | None:
        """Every rank's `value`, in rank order, on rank 0 (None on the others)."""
        if self.size == 1:
            return [value]
        out = [None] * self.size if self.first else None
        dist.gather_object(value, out, dst=0)
        return out

    def from_first(self, value: Value) -> Value:
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def rank_device(device: str) -> str:
    """The device of this rank: under torchrun, a CUDA device is the rank's own GPU (LOCAL_RANK)."""
    if under_torchrun() and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


@contextlib.contextmanager
def joined(device: str) -> Iterator[Ranks]:
    """This process's place among the ranks, the process group joined for the block where there is one."""
    if not under_torchrun():
        yield Ranks(0, 1)
        return
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()
