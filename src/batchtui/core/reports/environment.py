"""Where a run ran and on what: versions, CPU and GPU, the numerics flags and environment variables in effect, and
the identity of the model, tokenizer and texts, with a short fingerprint that sums them up. In every JSON report,
so that a result from another machine says what differs before any number is compared.

Weight files are hashed once: each file's SHA-256 is cached by (path, size, modification time).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from pathlib import Path

from ..cache_folder import cache_folder
from ..cpu_identity import cpu_identity
from ..errors import InputError
from ..models.source import WEIGHT_SUFFIXES
from ..untrusted import MiB, read_json

# Variables that change which kernels run or how they reduce.
NUMERICS_VARIABLES = (
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "TORCH_CUDNN_V8_API_DISABLED",
    "PYTORCH_CUDA_ALLOC_CONF",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
_CHUNK = 1 << 22
_MAX_CACHE_BYTES = 16 * MiB
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _gpus(torch) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        gpus.append({"name": properties.name, "capability": f"{properties.major}.{properties.minor}"})
    return gpus


def _driver() -> str | None:
    try:
        return Path("/sys/module/nvidia/version").read_text().strip() or None
    except OSError:
        return None


def numerics_flags(torch, invariant: bool = False) -> dict:
    """The switches that change how torch's kernels round and reduce, as they stand now."""
    matmul = torch.backends.cuda.matmul
    return {
        "tf32_matmul": bool(matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "invariant_mode": bool(invariant),
    }


def machine() -> dict:
    """Versions, CPU, GPU, threads, numerics flags and variables: what this process computes with."""
    import sys

    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "versions": {
            "batchtui": _version("batchtui"),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "python": sys.version.split()[0],
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
        },
        "platform": platform.platform(),
        "cpu": {
            "model": cpu_identity()[0],
            "capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count(),
        },
        "threads": torch.get_num_threads(),
        "gpus": _gpus(torch),
        "gpu_driver": _driver(),
        "variables": {name: os.environ[name] for name in NUMERICS_VARIABLES if name in os.environ},
    }


def _cache_path() -> Path:
    return cache_folder() / "file-hashes.json"


def file_hash(path: Path, cache: dict) -> str:
    """SHA-256 of a file, from `cache` when its path, size and modification time are those hashed before."""
    status = path.stat()
    key = f"{path.resolve()}|{status.st_size}|{status.st_mtime_ns}"
    if key not in cache:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        cache[key] = digest.hexdigest()
    return cache[key]


def _load_cache() -> dict:
    """The cached hashes; entries that are not a key and a SHA-256 in hex are dropped (the file is anyone's to
    write: a wrong value must never become a report's identity), an unreadable file is an empty cache."""
    try:
        saved = read_json(_cache_path(), _MAX_CACHE_BYTES, "hash cache")
    except InputError:
        return {}
    if not isinstance(saved, dict):
        return {}
    return {key: value for key, value in saved.items() if isinstance(value, str) and _SHA256.fullmatch(value)}


def _save_cache(cache: dict) -> None:
    path = _cache_path()
    try:
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        temp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(temp, path)
    except OSError:
        pass  # an unwritable cache only costs a hash next time


def model_folder(name: str) -> Path | None:
    """The folder holding model `name`'s files: a built-in's, a local folder, or a hub id's cached snapshot."""
    from ..models.builtin import builtin_names, builtin_path

    if name in builtin_names():
        return Path(builtin_path(name))
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or not a hub id: the identity says so
        return None


def model_identity(name: str) -> dict:
    """The model as files: hashes of its config, of each weight file and of its tokenizer files."""
    folder = model_folder(name)
    if folder is None:
        return {"model": name, "folder": None, "config_sha256": None, "weights_sha256": None, "tokenizer_sha256": None}
    cache = _load_cache()
    before = dict(cache)

    def combined(files: list[Path]) -> str | None:
        if not files:
            return None
        digest = hashlib.sha256()
        for file in files:
            digest.update(f"{file.name}:{file_hash(file, cache)}\n".encode())
        return digest.hexdigest()

    files = sorted(p for p in folder.iterdir() if p.is_file())
    config = folder / "config.json"
    identity = {
        "model": name,
        "folder": str(folder),
        "config_sha256": file_hash(config, cache) if config.is_file() else None,
        "weights_sha256": combined([p for p in files if p.name.endswith(WEIGHT_SUFFIXES)]),
        "tokenizer_sha256": combined([p for p in files if p.name in TOKENIZER_FILES]),
    }
    if cache != before:
        _save_cache(cache)
    return identity


def texts_hash(texts: list[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode()).hexdigest()


# Not in the fingerprint: the texts (a fingerprint is of a setup), and what differs between two machines' file
# systems and kernels without changing a number (where the model's files sit, the OS's release).
NOT_FINGERPRINTED = ("texts_sha256", "fingerprint", "platform", "identity.folder")


def fingerprint(environment: dict) -> str:
    """12 hex digits: two runs with the same fingerprint ran the same model files with the same software,
    hardware, flags and variables."""
    summed = {key: value for key, value in flatten(environment).items() if key not in NOT_FINGERPRINTED}
    return hashlib.sha256(json.dumps(summed, sort_keys=True, default=str).encode()).hexdigest()[:12]


def environment(model: str | None, texts: list[str], invariant: bool = False, served: dict | None = None) -> dict:
    """This machine, the numerics in effect, what was measured (`model`, or a served model's `served` URL and
    name) and the texts' hash, with the fingerprint."""
    import torch

    env = machine()
    env["numerics"] = numerics_flags(torch, invariant)
    env["identity"] = served if served is not None else model_identity(model) if model else None
    env["texts_sha256"] = texts_hash(texts)
    env["fingerprint"] = fingerprint(env)
    return env


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: environments compared field by field."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def differences(a: dict, b: dict, ignore: tuple[str, ...] = ("fingerprint",)) -> list[tuple[str, object, object]]:
    """(field, value in a, value in b) for every field that differs."""
    fa, fb = flatten(a), flatten(b)
    return [
        (k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if k not in ignore and fa.get(k) != fb.get(k)
    ]


def environment_summary(env: dict) -> str:
    """One line: the fingerprint, then what most often explains a difference between two machines."""
    gpus = ", ".join(g["name"] for g in env["gpus"]) or "no GPU"
    versions = env["versions"]
    flags = env["numerics"]
    tf32 = "TF32 on" if flags["tf32_matmul"] else "TF32 off"
    invariant = " · invariant mode" if flags["invariant_mode"] else ""
    return (
        f"fingerprint {env['fingerprint']} · torch {versions['torch']} · transformers {versions['transformers']} · "
        f"{env['cpu']['capability']} · {env['threads']} threads · {gpus} · {tf32}{invariant}"
    )
