"""Where this process sits among torchrun's ranks, from torchrun's variables, checked before torch loads."""

from __future__ import annotations

import os

from ..errors import InputError


def torchrun_place() -> tuple[int, int]:
    """(this process's rank, how many ranks) from torchrun's variables (RANK, WORLD_SIZE), checked: InputError, one
    line, for values that are not whole numbers, a rank outside 0..WORLD_SIZE-1, or a group without MASTER_ADDR and
    MASTER_PORT to meet at (the variables set by hand, not by torchrun). (0, 1) outside torchrun."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    values = {name: os.environ.get(name, "").strip() for name in names}
    numbers = {}
    for name, value in values.items():
        if value and not (value.isascii() and value.isdigit() and len(value) <= 6):
            raise InputError(f"{name}={value[:40]!r} is not a whole number (torchrun sets it: run under torchrun)")
        numbers[name] = int(value) if value else None
    size = 1 if numbers["WORLD_SIZE"] is None else numbers["WORLD_SIZE"]
    rank = numbers["RANK"] or 0
    if size < 1:
        raise InputError("WORLD_SIZE=0: no ranks at all (torchrun sets it: run under torchrun)")
    if rank >= size:
        raise InputError(f"RANK={rank} is not below WORLD_SIZE={size} (torchrun sets both: run under torchrun)")
    if size > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        raise InputError(f"WORLD_SIZE={size} without MASTER_ADDR and MASTER_PORT: the ranks have nowhere to meet (run "
                         "under torchrun)")  # fmt: skip
    return rank, size
