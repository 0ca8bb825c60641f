"""A repro pack read back: a folder someone else sent, so every file is bounded and checked before use.

The pack's settings are data, never permission: it cannot turn on remote code (`trust_remote_code` is read as
false whatever it says), and which model runs is the reader's choice (`cli.from_pack`). The logits file's
header is checked against the texts' token counts and the vocabulary before a tensor is read.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError
from ..settings import Settings
from ..texts import MAX_TEXTS_FILE_BYTES
from ..untrusted import MiB, check, list_of, read_capped, read_json
from .reading import MAX_REPORT_BYTES, validated_report

if TYPE_CHECKING:
    import torch

REPORT, TEXTS, COMMAND, LOGITS = "report.json", "texts.json", "command.json", "logits.safetensors"
MAX_COMMAND_BYTES = 1 * MiB
DEFAULT_LOGITS_MB = 512  # what `--repro` keeps at most unless told otherwise (`--repro-max-mb`, read here too)
_HEADER_BYTES = 64 * MiB  # the safetensors header beside the logits: names, shapes and offsets
_TENSOR_NAME = re.compile(r"^(single|batched)/(0|[1-9][0-9]{0,8})$")
_LOGIT_DTYPES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}


@dataclass
class Pack:
    path: Path
    report: dict
    texts: list[str]
    lines: list[int]
    settings: Settings  # as recorded, except that remote code is never on
    command: list[str]
    single: dict[int, torch.Tensor] = field(default_factory=dict)
    batched: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def is_generation(self) -> bool:
        return "generate" in self.command[:4]


def read_pack(directory: str, max_logits_mb: float = DEFAULT_LOGITS_MB) -> Pack:
    """The pack in `directory`, every file checked, its logits file at most `max_logits_mb`; InputError naming
    the first thing wrong."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise InputError(f"{directory}: no such pack folder")
    # no file of a pack is followed out of it by a symlink: a pack is read as what it holds
    report = validated_report(
        read_json(path / REPORT, MAX_REPORT_BYTES, "pack report", links=False), f"pack {directory}"
    )
    texts = read_json(path / TEXTS, MAX_TEXTS_FILE_BYTES, "pack texts", links=False)
    texts, lines = _texts(texts, f"pack {directory}: texts")
    where = f"pack {directory}: command.json"
    about: dict = check(read_json(path / COMMAND, MAX_COMMAND_BYTES, "pack command", links=False), "object", where)
    command = list_of(about.get("command"), "string", f"{where}: 'command'")
    settings = _settings(check(about.get("settings"), "object", f"{where}: 'settings'"), where)
    if [entry["text"] for entry in report["texts"]] != texts:
        raise InputError(f"pack {directory}: its report and texts.json hold different texts")
    pack = Pack(path, report, texts, lines, settings, command)
    if (path / LOGITS).exists() or (path / LOGITS).is_symlink():
        _read_logits(pack, path / LOGITS, int(max_logits_mb * MiB) + _HEADER_BYTES)
    return pack


def _texts(given: object, where: str) -> tuple[list[str], list[int]]:
    value: dict = check(given, "object", where)
    texts = list_of(value.get("texts"), "string", f"{where}: 'texts'")
    lines = list_of(value.get("lines"), "whole number", f"{where}: 'lines'")
    if len(texts) != len(lines):
        raise InputError(f"{where}: {len(texts)} texts but {len(lines)} line numbers")
    if not texts:
        raise InputError(f"{where}: no texts")
    return texts, lines


def _settings(saved: dict, where: str) -> Settings:
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise InputError(f"{where}: unknown settings {', '.join(map(repr, unknown))}")
    try:
        return Settings(**(saved | {"trust_remote_code": False})).validated()
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _read_logits(pack: Pack, file: Path, cap: int) -> None:
    """Check the safetensors header (names, dtypes, shapes against the texts, offsets), then load."""
    from safetensors.torch import load

    data = read_capped(file, cap, "pack logits (raise the limit with --repro-max-mb)", links=False)
    where = f"pack {pack.path}: {LOGITS}"
    if len(data) < 8:
        raise InputError(f"{where}: not a safetensors file")
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > len(data) - 8:
        raise InputError(f"{where}: its header claims {header_size} bytes, more than the file holds")
    try:
        header = json.loads(data[8 : 8 + header_size].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{where}: its header is not JSON") from None
    check(header, "object", where)
    body = len(data) - 8 - header_size
    for name, entry in header.items():
        if name != "__metadata__":
            _check_tensor(pack, name, entry, body, where)
    try:
        tensors = load(data)
    except Exception as exc:  # noqa: BLE001 - a malformed file, whatever the library calls it
        raise InputError(f"{where}: unreadable ({type(exc).__name__})") from None
    for name, tensor in tensors.items():
        run, _, index = name.partition("/")
        getattr(pack, run)[int(index)] = tensor


def _check_tensor(pack: Pack, name: str, given: object, body: int, where: str) -> None:
    match = _TENSOR_NAME.match(name)
    if match is None or int(match[2]) >= len(pack.texts):
        raise InputError(f"{where}: unexpected tensor {name[:60]!r} (single/<i> or batched/<i> of its texts only)")
    index = int(match[2])
    entry: dict = check(given, "object", f"{where}: {name}")
    dtype = entry.get("dtype")
    if dtype not in _LOGIT_DTYPES:
        raise InputError(f"{where}: {name} has dtype {str(dtype)[:20]!r}, not a floating type of logits")
    shape = list_of(entry.get("shape"), "whole number", f"{where}: {name}: shape")
    rows, vocabulary = _expected_shape(pack, index)
    if len(shape) != 2 or shape[1] != vocabulary or not 0 < shape[0] <= rows:
        raise InputError(f"{where}: {name} has shape {shape[:4]}, not [at most {rows}, {vocabulary}]")
    offsets = list_of(entry.get("data_offsets"), "whole number", f"{where}: {name}: data_offsets")
    start, end = offsets if len(offsets) == 2 else (-1, -1)
    if not 0 <= start <= end <= body or end - start != shape[0] * shape[1] * _LOGIT_DTYPES[dtype]:
        raise InputError(f"{where}: {name}'s data offsets do not fit its shape and the file")


def _expected_shape(pack: Pack, index: int) -> tuple[int, int]:
    """At most how many rows text `index`'s logits have (its tokens, or the steps generated), and the vocabulary."""
    config = pack.report["config"]
    vocabulary = config.get("vocab_size")
    if vocabulary is None:
        raise InputError(f"pack {pack.path}: its report does not say the vocabulary size, so its logits are not read")
    entry = pack.report["texts"][index]
    rows = config.get("max_new_tokens") if pack.is_generation else len(entry.get("tokens") or [])
    return rows or 0, vocabulary


@dataclass(frozen=True)
class ChosenModel:
    settings: Settings  # the pack's, with the model that runs and whether its code may run
    line: str  # one line for the user: which model, and whether it is the pack's


def choose_model(pack: Pack, model: str | None, trust_remote_code: bool) -> ChosenModel:
    """The model a pack runs on: `model` when the user named one (its own code runs only with
    `trust_remote_code`), else the pack's when that is a built-in or a hub id already in the local cache. A
    pack never names a folder to load or turns on remote code by itself."""
    recorded = pack.settings.model
    if trust_remote_code and model is None:
        raise InputError("--trust-remote-code is for a model named with --model on the same command line")
    if model is None:
        problem = _not_loadable_unasked(recorded)
        if problem:
            raise InputError(f"the pack's model {recorded!r} {problem}: name the model to run it on with --model")
        return ChosenModel(pack.settings, f"model: {recorded} (the pack's)")
    settings = pack.settings.with_changes(model=model, trust_remote_code=trust_remote_code).validated()
    if model == recorded:
        return ChosenModel(settings, f"model: {model} (the pack's)")
    return ChosenModel(settings, f"model: {model}, not the pack's {recorded}: the logits compared are another model's")


def _not_loadable_unasked(name: str) -> str | None:
    """Why the pack's own model may not load without the user naming it; None for a built-in or a cached hub id."""
    from ..models.builtin import builtin_names
    from ..models.source import is_hub_id

    if name in builtin_names():
        return None
    if Path(name).expanduser().exists() or not is_hub_id(name):
        return "is a path on this machine, not a built-in model or a hub id"
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        return "is not in the local hub cache (a pack never downloads a model)"
    return None
