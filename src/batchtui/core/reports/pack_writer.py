"""Repro packs: what a user attaches to a bug report, and what `check --from` runs again.

A pack is a folder: `report.json` (the run's report, its environment included), `texts.json` (the texts and
their lines), `command.json` (the command line and the settings it resolved to) and `logits.safetensors` (each
text's logits alone, `single/<i>`, and in its batch, `batched/<i>`, in the model's dtype; texts past the size
cap are left out and listed in `command.json`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..settings import Settings
from .pack_reader import COMMAND, LOGITS, REPORT, TEXTS

if TYPE_CHECKING:  # torch loads with the run, not with the command's parser
    import torch


def check_pack_destination(directory: str) -> Path:
    """A new or empty folder, checked before the run: a pack never writes over anything."""
    path = Path(directory).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"--repro {directory}: it exists and is not an empty folder (a pack never overwrites)")
    if not path.parent.is_dir():
        raise InputError(f"--repro {directory}: folder {path.parent} does not exist")
    return path


class KeptLogits:
    """A `compare` logits sink that keeps CPU copies of each text's logits, up to `cap_bytes` in all."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.single: dict[int, torch.Tensor] = {}
        self.batched: dict[int, torch.Tensor] = {}
        self.left_out: list[int] = []
        self.bytes = 0

    def __call__(self, index: int, single: torch.Tensor, batched: torch.Tensor) -> None:
        size = 2 * single.numel() * single.element_size()
        if self.bytes + size > self.cap_bytes:
            self.left_out.append(index)
            return
        self.single[index] = single.detach().to("cpu", copy=True).contiguous()
        self.batched[index] = batched.detach().to("cpu", copy=True).contiguous()
        self.bytes += size


def write_pack(path: Path, report: dict, texts: list[str], lines: list[int], command: list[str], settings: Settings,
               kept: KeptLogits) -> None:  # fmt: skip
    from safetensors.torch import save_file

    from ..safe_files import umask, write_text

    path.mkdir(exist_ok=True)
    tensors = {f"single/{i}": t for i, t in kept.single.items()} | {f"batched/{i}": t for i, t in kept.batched.items()}
    save_file(tensors, str(path / LOGITS))
    os.chmod(path / LOGITS, 0o666 & ~umask())  # (safetensors writes it 0600: the pack's files alike, as umask says)
    write_text(path / TEXTS, json.dumps({"texts": texts, "lines": lines}, ensure_ascii=False, indent=1) + "\n")
    about = {"command": command, "settings": settings.as_dict(), "logits_left_out": kept.left_out}
    write_text(path / COMMAND, json.dumps(about, indent=1) + "\n")
    write_text(path / REPORT, json.dumps(report, indent=1, allow_nan=False) + "\n")


def check_command(settings: Settings) -> list[str]:
    """The `check` command line that runs `settings` (what the app's packs record as their command)."""
    command = ["batchtui", "check", "--model", settings.model, "--dtype", settings.dtype, "--device", settings.device]
    command += ["--batch-size", str(settings.batch_size), "--padding-side", settings.padding_side]
    command += ["--positions", settings.positions, "--top-k", str(settings.top_k)]
    command += ["--atol", repr(settings.atol), "--rtol", repr(settings.rtol)]
    if settings.attn:
        command += ["--attn", settings.attn]
    if settings.max_tokens:
        command += ["--max-tokens", str(settings.max_tokens)]
    if settings.invariant and settings.invariant_classes:
        command += ["--invariant-classes", settings.invariant_classes]
    flags = ("modules", "decompose", "reference", "invariant", "trust_remote_code")
    return command + [f"--{flag.replace('_', '-')}" for flag in flags if getattr(settings, flag)]
