"""The mode's compiled CPU kernels, C++ and OpenMP built with torch's own extension tools (`torch.utils.cpp_extension`)
on first use, once per machine: attention summed in one fixed order (`compiled/ordered_attention.cpp`), and a
float32 or bfloat16 linear layer's rows summed in one fixed order (`compiled/fixed_order_linear.cpp`).

The attention's Python path (`attention_tiles`, `attention_scan`) is some twenty small calls a layer, most of a small
model's cost in the mode; the compiled kernel is one call, each query computed whole by one thread in key order. A
model's linear layers in the GEMM libraries keep a row's bits only from a measured height and up to measured ones
(float32's decoding step of 8 rows padded to 16, a prefill's rows padded up to a height checked, a tall call cut into
calls that each read the whole weight again); the compiled one keeps them at any height, measured nothing.
They are built for this CPU (`-march=native`; `BATCHTUI_KERNELS_MARCH=x86-64-v3` builds them as for an AVX2-only CPU),
so their folder is named by everything that decides their code: the
CPU model and flags, torch's version and build, the sources, the flags: `$XDG_CACHE_HOME/batchtui/compiled/<digest>/`
(clear it with `rm -r ~/.cache/batchtui/compiled`). Where they cannot be built (no C++ compiler, no ninja) or
`BATCHTUI_COMPILED_KERNELS=0` is set, the Python paths are taken, with one line saying why: the same promise, slower.
The choice is made once a process, so that every pass of a process takes the same path (the paths round otherwise:
a text's bits are the same in every arrival within one path)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ..cache_folder import cache_folder
from ..cpu_identity import cpu_identity
from ..models.loading import resolve_device
from ..settings import Settings
from .measuring import say

_HOME = Path(__file__).parent / "compiled"
SOURCES = (_HOME / "ordered_attention.cpp", _HOME / "fixed_order_linear.cpp")
SWITCH = "BATCHTUI_COMPILED_KERNELS"  # "0": the Python paths; "triton": the Triton kernels, interpreted (`gpu_kernels`)
_NOT_BUILT = ("0", "triton")
# -ffp-contract=off: no fused multiply-add in a vector body that its scalar tail would round otherwise;
# -fno-trapping-math: the exponential's select vectorizes (no value changes, only floating-point flags)
_CFLAGS = ("-O3", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp")
# The instruction set they are built for: this CPU's, or another named (`x86-64-v3`: an AVX2-only CPU's, which the
# CI builds to test the kernels' AVX2 code on any machine)
MARCH = "BATCHTUI_KERNELS_MARCH"

_NAME = "batchtui_kernels"
_LINEAR_DTYPES = (torch.float32, torch.bfloat16)
_STALE_LOCK_S = 600
_lock = threading.Lock()  # held while building: a caller meanwhile waits for the answer
_built: list[bool] = []  # [whether the kernels could be built]: decided once a process


def compiled_attention(t: torch.Tensor) -> Callable | None:
    """The compiled attention op for tensors like `t` (CPU, floating), or None: the Python path."""
    return torch.ops.batchtui.ordered_attention if _usable(t) else None


def compiled_linear(t: torch.Tensor) -> Callable | None:
    """The compiled fixed-order linear op for rows like `t` (CPU, float32 or bfloat16), or None: the GEMM library's
    paths."""
    return torch.ops.batchtui.fixed_order_linear if t.dtype in _LINEAR_DTYPES and _usable(t) else None


def _usable(t: torch.Tensor) -> bool:
    if t.device.type != "cpu" or os.environ.get(SWITCH) in _NOT_BUILT:
        return False
    if not _built:
        _decide()
    return _built[0]


def build_beside_loading(settings: Settings) -> None:
    """Where `settings` run the mode on the CPU, start building the kernel now, while the model loads (the first
    attention call waits for what is left). Not a daemon thread: a process that ends meanwhile waits for the build,
    whose lock file would otherwise be left behind for the next one."""
    wanted = settings.invariant and resolve_device(settings.device) == "cpu"
    if wanted and not _built and os.environ.get(SWITCH) not in _NOT_BUILT:
        threading.Thread(target=_decide, name="batchtui-kernel-build").start()


def _decide() -> None:
    with _lock:
        if not _built:
            _built.append(_build())


def _folder() -> Path:
    cpu, flags = cpu_identity()
    parts = (cpu, flags, platform.machine(), torch.__version__, torch.__config__.show(), " ".join(_cflags()))
    sources = b"".join(path.read_bytes() for path in SOURCES)
    digest = hashlib.sha256("\n".join(parts).encode() + sources).hexdigest()[:16]
    return cache_folder() / "compiled" / digest


def _cflags() -> list[str]:
    march = os.environ.get(MARCH) or "native"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", march):
        raise RuntimeError(f"{MARCH}={march!r} is not an instruction set's name")
    return [*_CFLAGS, f"-march={march}"]


def _build() -> bool:
    if not hasattr(torch.ops.batchtui, "fixed_order_linear"):
        try:
            folder = _folder()
            folder.mkdir(parents=True, exist_ok=True)
            _clear_stale_lock(folder)
            if not (folder / f"{_NAME}.so").exists():
                say("", notice="building the mode's kernels for this CPU with torch's extension tools "
                               "(once on this machine, a few seconds)")  # fmt: skip
            _load(folder)
        except Exception as exc:  # noqa: BLE001 - a compiler's or a linker's failure is any of many types
            reason = _why(exc)
            say("", notice=f"the mode's kernels could not be built here ({reason}): their Python paths are "
                           "taken (the same bits in every arrival, slower)")  # fmt: skip
            return False
    return True


def _why(exc: Exception) -> str:
    """The line of a failed build that says what failed (the compiler's error), short."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    said = [line for line in lines if any(word in line.lower() for word in ("error", "not found", "no such file"))]
    return (said or lines)[-1][:160]


def _clear_stale_lock(folder: Path) -> None:
    """torch's extension tools hold a `lock` file in the folder while one process builds and make every other wait
    for it to go: one left by a process killed mid-build (minutes old: a build takes seconds) would make them wait
    for ever."""
    lock = folder / "lock"
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)
    except OSError:  # none there (the usual case), or not ours to remove: the build says what goes wrong
        pass


def _load(folder: Path) -> None:
    from torch.utils import cpp_extension  # imported only to build: it pulls in setuptools

    compiler = os.environ.get("CXX", "c++")  # what torch's extension tools run
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler} not found")
    with _quietly(cpp_extension.__name__), _ninja_on_path():
        cpp_extension.load(
            name=_NAME,
            sources=[str(path) for path in SOURCES],
            extra_cflags=_cflags(),
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            is_python_module=False,
            verbose=False,
        )


@contextlib.contextmanager
def _quietly(logger: str) -> Iterator[None]:
    """The extension tools' warnings (about compiler versions) are for extension authors, not for the user."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's extension tools run `ninja` by name: the `ninja` package's own where none is on PATH."""
    path = os.environ.get("PATH", "")
    if shutil.which("ninja") is None:
        try:
            import ninja

            os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path])
        except ImportError:
            pass
    try:
        yield
    finally:
        os.environ["PATH"] = path
