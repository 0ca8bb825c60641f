"""Past one process: the ranks of a torchrun (`torchrun --nproc-per-node N -m batchtui.core rollouts ...`), through
torch.distributed (gloo on CPUs, nccl on GPUs). Outside torchrun, one rank of one, with no process group."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from ..errors import InputError
from .job import DEFAULT_DIST_TIMEOUT_S
from .torchrun_place import torchrun_place

Value = TypeVar("Value")


@dataclass(frozen=True)
class Ranks:
    rank: int
    size: int
    timeout_s: float = DEFAULT_DIST_TIMEOUT_S

    @property
    def first(self) -> bool:
        return self.rank == 0

    def gathered(self, value: object) -> list | None:
        """Every rank's `value`, in rank order, on rank 0 (None on the others)."""
        if self.size == 1:
            return [value]
        out = [None] * self.size if self.first else None
        with _answered(self.timeout_s):
            dist.gather_object(value, out, dst=0)
        return out

    def from_first(self, value: Value) -> Value:
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        with _answered(self.timeout_s):
            dist.broadcast_object_list(box, src=0)
        return box[0]


def under_torchrun() -> bool:
    return torchrun_place()[1] > 1


@contextlib.contextmanager
def _answered(timeout_s: float) -> Iterator[None]:
    """A collective call: another rank's death or silence past the timeout is `RanksLost`, one line."""
    try:
        yield
    except RuntimeError as exc:  # (gloo's and nccl's errors: DistBackendError and its kin)
        raise RanksLost(f"another rank stopped or did not answer within {timeout_s:g} s (--dist-timeout): "
                        f"{str(exc).splitlines()[0][:200]}") from None  # fmt: skip


class RanksLost(InputError):
    """Another rank did not come, stopped or did not answer in time: this one ends too (its records stay
    resumable)."""


def rank_device(device: str) -> str:
    """The device of this rank: under torchrun, a CUDA device is the rank's own GPU (LOCAL_RANK)."""
    if under_torchrun() and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


@contextlib.contextmanager
def joined(device: str, timeout_s: float = DEFAULT_DIST_TIMEOUT_S) -> Iterator[Ranks]:
    """This process's place among the ranks, the process group joined for the block where there is one; the ranks
    wait `timeout_s` for each other at most, to meet and at every gather (`RanksLost` after it)."""
    if not under_torchrun():
        yield Ranks(0, 1)
        return
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(torch.device(device))
    try:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as exc:  # (torch's DistStoreError and DistNetworkError are RuntimeErrors)
        raise RanksLost(f"the {torchrun_place()[1]} ranks did not all meet within {timeout_s:g} s "
                        f"(--dist-timeout): {str(exc).splitlines()[0][:200]}") from None  # fmt: skip
    try:
        yield Ranks(dist.get_rank(), dist.get_world_size(), timeout_s)
    finally:
        dist.destroy_process_group()
