"""Whether the mode takes its Triton kernels (`triton_kernels`) for a tensor: on CUDA where Triton is installed (torch's
CUDA builds bring it), and on a CPU only where `BATCHTUI_COMPILED_KERNELS=triton` asks for them in Triton's
interpreter (slow: the tests run the mode's whole forward through them so). Decided once a process by a first small
call of each kernel that must keep a row's bits at two heights; where Triton is missing, fails to compile or the
check fails, the Python paths (fixed-height tiles) are taken, with one line saying why: the same promise, slower."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from types import ModuleType

import torch

from .compiled_kernels import SWITCH
from .measuring import say

if os.environ.get(SWITCH) == "triton" and "triton" not in sys.modules:
    # Triton reads this at its import, which loading a model may do before the mode's first call
    os.environ.setdefault("TRITON_INTERPRET", "1")
_lock = threading.Lock()
_checked: dict[str, ModuleType | None] = {}  # device type -> the kernels' module, or None: decided once a process


def triton_kernels(t: torch.Tensor) -> ModuleType | None:
    """The Triton kernels' module for tensors like `t` (of a dtype they take), or None: the Python paths."""
    device = t.device.type
    wanted = os.environ.get(SWITCH)
    if wanted == "0" or not (device == "cuda" or (device == "cpu" and wanted == "triton")):
        return None
    if device not in _checked:
        with _lock:
            if device not in _checked:
                _checked[device] = _checked_kernels(t.device)
    kernels = _checked[device]
    return kernels if kernels is not None and t.dtype in kernels.DTYPES else None


def _checked_kernels(device: torch.device) -> ModuleType | None:
    if importlib.util.find_spec("triton") is None:
        return _refused("Triton is not installed")
    if device.type == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            return _refused("triton was imported before its interpreter was asked for")
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from . import triton_kernels as kernels

        kept = _rows_kept(kernels, device)
    except Exception as exc:  # noqa: BLE001 - a compiler's failure is any of many types
        return _refused((str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160])
    return kernels if kept else _refused("a row's bits changed with the call's height on a first check")


def _rows_kept(kernels: ModuleType, device: torch.device) -> bool:
    """Whether a first small call of each kernel gives a row alone the bits it gets among others."""
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    rows, weight = random(40, 96), random(48, 96)
    product = kernels.fixed_order_matmul(rows, weight.t())
    alone = kernels.fixed_order_matmul(rows[7:8], weight.t())
    query, key, value = random(1, 2, 24, 32), random(1, 1, 24, 32), random(1, 1, 24, 32)
    causal = torch.arange(1, 25, device=device).view(1, 1, 24).expand(1, 2, 24)
    starts = torch.zeros(1, 24, dtype=torch.long, device=device)
    tiles = kernels.query_tiles(starts)
    prefill = kernels.ordered_attention_gpu(query, key, value, tiles, causal, 0.2, None, None, None)
    step = kernels.ordered_attention_gpu(
        query[:, :, 20:21], key[:, :, :21], value[:, :, :21], kernels.query_tiles(starts[:, :1]),
        causal[:, :, 20:21], 0.2, None, None, None,
    )  # fmt: skip
    return torch.equal(product[7:8], alone) and torch.equal(prefill[:, :, 20:21], step)


def _refused(reason: str) -> ModuleType | None:
    """None, the Python paths, said once with `reason`."""
    say("", notice=f"the mode's Triton kernels are not taken here ({reason}): their Python paths are (the same "
                   "bits in every arrival, slower)")  # fmt: skip
    return None
