"""What a rollouts run is asked to do (the command's or the app's arguments), checked before torch loads."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import InputError
from ..numbers.importance import DEFAULTS, Correction
from ..run.trl_call import check_trl
from ..settings import Settings
from .plan import DEFAULT_BATCH_TOKENS
from .torchrun_place import torchrun_place

DEFAULT_DIST_TIMEOUT_S = 120.0  # `--dist-timeout`: how long ranks wait for each other (torch's own is 30 minutes)


@dataclass(frozen=True)
class RolloutsJob:
    path: str
    settings: Settings
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    records: str | None = None  # `--records`
    resume: bool = False
    skip_bad: bool = False
    dist_timeout_s: float = DEFAULT_DIST_TIMEOUT_S
    temperature: float | None = None  # `--temperature`: None takes the lines' (1 where they say none)
    correction: Correction = DEFAULTS  # `--clip-eps`, `--tis-cap`, `--tis-floor`
    max_kl: float | None = None  # `--max-kl`
    trainer: str = "batchtui"  # `--trainer`: how the trainer's forward calls the model (`trainer_forward.trainer_call`)
    layout: str = "grpo"  # `--layout`: TRL's GRPO padding, or packed (`run.packed_layout`)

    def checked(self) -> RolloutsJob:
        torchrun_place()  # torchrun's variables, when set, are torchrun's: checked before anything waits on them
        if not 0 < self.dist_timeout_s <= 86_400:
            raise InputError(f"--dist-timeout must be above 0 and at most 86400 seconds, not {self.dist_timeout_s:g}")
        if self.temperature is not None and not 0 < self.temperature <= 1000:  # (NaN fails it too)
            raise InputError(f"--temperature must be above 0 and at most 1000, not {self.temperature:g}")
        c = self.correction
        if not 0 < c.clip_eps <= 10:
            raise InputError(f"--clip-eps must be above 0 and at most 10, not {c.clip_eps:g}")
        if not 1 <= c.tis_cap <= 1e6:
            raise InputError(f"--tis-cap must be at least 1 and at most 1e6, not {c.tis_cap:g}")
        if c.tis_floor is not None and not 0 <= c.tis_floor <= 1:
            raise InputError(f"--tis-floor must be at least 0 and at most 1, not {c.tis_floor:g}")
        if self.max_kl is not None and not 0 <= self.max_kl < float("inf"):
            raise InputError(f"--max-kl must be a number of at least 0, not {self.max_kl:g}")
        if self.trainer not in ("batchtui", "trl"):
            raise InputError(f"--trainer is batchtui or trl, not {self.trainer!r}")
        if self.layout not in ("grpo", "packed"):
            raise InputError(f"--layout is grpo or packed, not {self.layout!r}")
        if self.trainer == "trl" and self.layout == "packed":
            raise InputError(
                "--trainer trl scores in TRL's GRPO layout (it pads), --layout packed as verl and OpenRLHF do: give one"
            )
        if self.trainer == "trl":
            check_trl()
        if self.batch_tokens < 1:
            raise InputError(f"--batch-tokens must be at least 1, not {self.batch_tokens}")
        if self.resume and not self.records:
            raise InputError("--resume goes on from a records file: give it with --records")
        if self.records and not self.resume and os.path.lexists(self.records):
            raise InputError(f"records file {self.records} exists: --resume continues it (or give another path)")
        if self.records and os.path.exists(self.records) and not os.path.isfile(self.records):
            raise InputError(f"records file {self.records} is not a regular file (a folder, FIFO or device)")
        return self
