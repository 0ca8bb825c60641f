"""What is wrong with a model's path or hub id, said in one line before (or instead of) transformers'
own words: a missing folder, a file where a folder is wanted, a folder without config or weights, a name
that is not a hub id, a hub id that is neither cached nor reachable."""

from __future__ import annotations

import os
import re
from pathlib import Path

# owner/name or name: letters, digits, '-', '_', '.'; neither part starts or ends with '-' or '.'.
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?:{_PART}/)?{_PART}$")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def is_hub_id(name: str) -> bool:
    """Whether `name` has the form of a hub id (owner/name or name), whatever is on disk."""
    return bool(_HUB_ID.match(name))


def _looks_like_a_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.sep in name.strip("/").replace("/", os.sep, 1)[1:]


def source_problem(name: str) -> str | None:
    """One line saying why `name` cannot be a model, from the file system and the name alone; None when
    it may well be one (a model folder, or a well-formed hub id)."""
    path = Path(name).expanduser()
    if path.is_dir():
        files = {child.name for child in path.iterdir()}
        if "config.json" not in files:
            return f"folder {name!r} has no config.json: it is not a transformers model folder"
        if not any(file.endswith(WEIGHT_SUFFIXES) for file in files):
            return f"folder {name!r} has a config.json but no weights (*.safetensors or *.bin)"
        return None
    if path.exists():
        return f"{name!r} is a file: a model is a folder (config.json, weights, tokenizer) or a hub id"
    if _looks_like_a_path(name) and not _HUB_ID.match(name):
        return f"no folder {name!r} (a model is a local folder or a hub id such as Qwen/Qwen2.5-1.5B-Instruct)"
    if not _HUB_ID.match(name):
        return f"{name!r} is neither a local folder nor a hub id (owner/name, such as Qwen/Qwen2.5-1.5B-Instruct)"
    return None


# One request to the hub's root answers whether it can be reached at all; its own retries take most of a
# minute per file to say the same.
_HUB_PROBE_TIMEOUT_S = 5.0


def hub_files_only(name: str) -> bool:
    """For a hub id (not a folder here): True when it must load from the local cache alone, because the hub
    cannot be reached now (huggingface_hub would retry it for every file before falling back to the cache:
    minutes); ModelLoadError when it is not cached either. False to load it as usual."""
    from huggingface_hub import constants, try_to_load_from_cache

    from ..errors import ModelLoadError

    if Path(name).expanduser().exists() or constants.HF_HUB_OFFLINE or _hub_answers():
        return False
    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise ModelLoadError(_NOT_CACHED_NOR_REACHABLE.format(name=name))
    return True


def _hub_answers() -> bool:
    """Whether the hub (HF_ENDPOINT, through huggingface_hub's own session and proxies) answers one request."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=_HUB_PROBE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - any failure to get an answer: DNS, refused, reset, TLS, timeout
        return False
    return True


_NOT_CACHED_NOR_REACHABLE = (
    "hub id {name!r} is not in the local cache and the hub cannot be reached: pass a local folder"
)


def load_failure_message(name: str, source: str, attn: str | None, exc: BaseException) -> str:
    """transformers' error for a source that passed `source_problem`, in words about the path or id (`name` as the
    user gave it, `source` where it was read from: a built-in model's folder) or about the attention asked for."""
    said = first_line(exc)
    if attn and ("attn_implementation" in said or "attention" in said.lower()):
        return f"attention {attn!r} cannot be used with model {name!r} here: {said}"
    if Path(source).expanduser().exists():
        return f"cannot load model {name!r}: {said}"
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
    lowered = said.lower()
    if offline:
        return f"hub id {name!r} is not in the local cache and HF_HUB_OFFLINE is set: pass a local folder"
    if "couldn't connect" in lowered or "connection" in lowered or "offline" in lowered:
        return _NOT_CACHED_NOR_REACHABLE.format(name=name)
    if "not a valid model identifier" in lowered or "repository not found" in lowered or "404" in lowered:
        return f"no model {name!r} on the hub and no local folder of that name"
    return f"cannot load model {name!r} (no local folder of that name, so read as a hub id): {said}"
