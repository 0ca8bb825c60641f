"""What a rollouts run is asked to do (the command's or the app's arguments), checked before torch loads."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import InputError
from ..settings import Settings
from .plan import DEFAULT_BATCH_TOKENS


@dataclass(frozen=True)
class RolloutsJob:
    path: str
    settings: Settings
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    records: str | None = None  # `--records`
    resume: bool = False
    skip_bad: bool = False

    def checked(self) -> RolloutsJob:
        if self.batch_tokens < 1:
            raise InputError(f"--batch-tokens must be at least 1, not {self.batch_tokens}")
        if self.resume and not self.records:
            raise InputError("--resume goes on from a records file: give it with --records")
        if self.records and not self.resume and os.path.lexists(self.records):
            raise InputError(f"records file {self.records} exists: --resume continues it (or give another path)")
        if self.records and os.path.exists(self.records) and not os.path.isfile(self.records):
            raise InputError(f"records file {self.records} is not a regular file (a folder, FIFO or device)")
        return self
