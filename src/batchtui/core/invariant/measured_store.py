"""What the mode measured on this machine, kept on disk so that the next process pays no measuring.

`rows.choose` measures, once per kind of call, which path keeps a row's bits from which call height (seconds on a
large weight). Those answers depend on the machine and the software only: the CPU (its model and flags), torch and
the libraries it was built with (MKL, oneDNN: `torch.__config__.show()`), the CPU capability ATen dispatches to and
the environment variables that steer those libraries; the dtype, shapes and thread count are in each kind's key. All
of it together is the file's key: `$XDG_CACHE_HOME/batchtui/invariant/rows-<digest>.json`, one file per key, so an
answer is never read on another machine or software (a change of any of them names another file).

The file is read as anything from outside is (bounded, field by field): a damaged, truncated or foreign file is
ignored, said once, and written anew. Each answer taken from it is checked on its first use in the process by a few
calls of the path it names (`rows._still_keeps`), and measured again where the check fails. New answers are merged
into the file under a lock and written whole (a temporary file renamed over it): two processes filling it at once
leave a whole file. A folder that cannot be written costs only the measuring. Clear it with
`rm -r ~/.cache/batchtui/invariant`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache_folder import cache_folder
from ..compat.torch import cpu_kernel_sites
from ..cpu_identity import cpu_identity
from ..errors import InputError
from ..safe_files import write_text
from ..untrusted import MiB, read_json

FORMAT = 2
MAX_BYTES = 4 * MiB  # far above what a model's few dozen kinds of call hold (~300 bytes each)
# Environment variables that change which kernels the libraries take (and so a row's bits).
_STEERING = ("ATEN_CPU_CAPABILITY", "ONEDNN_", "DNNL_", "MKL_", "OMP_", "KMP_", "OPENBLAS_")


@dataclass(frozen=True)
class Kept:
    """One kind of call's answer: the path's name, the height it keeps rows from (None: tiles), the tallest call
    made, each path's measured height, the paths that could not run here."""

    path: str
    floor: int | None
    ceiling: int
    heights: dict[str, int | None]
    failed: tuple[str, ...]
    unneeded: tuple[str, ...] = ()  # paths measured only below the chosen one's height

    def as_json(self) -> dict:
        return {"path": self.path, "floor": self.floor, "ceiling": self.ceiling, "heights": self.heights,
                "failed": list(self.failed), "unneeded": list(self.unneeded)}  # fmt: skip


@functools.cache  # (read once a process: /proc/cpuinfo and torch's build text)
def machine_key() -> dict[str, str]:
    """Everything besides a call's own key that decides which path keeps rows, and from which height."""
    cpu, flags = cpu_identity()
    steering = {name: value for name, value in sorted(os.environ.items()) if name.startswith(_STEERING)}
    return {
        "format": str(FORMAT),
        "cpu": cpu,
        "flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "machine": platform.machine(),
        "torch": torch.__version__,
        "build": hashlib.sha256(torch.__config__.show().encode()).hexdigest()[:16],  # MKL's and oneDNN's versions
        "capability": torch.backends.cpu.get_cpu_capability(),
        "environment": json.dumps(steering, sort_keys=True),
    }


# The ops whose CPU kernels the measured paths call (the library's op, its out overload, oneDNN's inner product)
_MEASURED_OPS = (
    *(f"aten::{op}{overload}" for op in ("mm", "addmm", "bmm", "baddbmm") for overload in ("", ".out")),
    "aten::sum.dim_IntList",
    "aten::sum.IntList_out",
    "aten::mean.dim",
    "aten::mean.out",
    "aten::linalg_vector_norm",
    "aten::linalg_vector_norm.out",
    "mkldnn::_linear_pointwise",
)
_OURS = str(Path(__file__).resolve().parent.parent)  # a registration made from here is the mode's own


def kernel_site(op: str) -> str:
    """Where the CPU kernel of `op` ("aten::mm.out") in use now was registered, the mode's own registrations looked
    through: two ops whose sites are one are one kernel (a linear layer's product through the op or its out overload
    is measured once, not once each)."""
    return next((site for site in cpu_kernel_sites(op) or [] if _OURS not in site), "none")


def registered_kernels() -> str:
    """Which CPU kernel each op the measured paths call has now (where it was registered: torch's own, or a library
    or user code that registered one through `torch.library`), the mode's own registrations looked through. A kernel
    registered since (or in another process) names other measurements (`MeasuredStore.use_kernels`)."""
    return "\n".join(f"{op}: {kernel_site(op)}" for op in _MEASURED_OPS)


def call_key(key: tuple) -> str:
    """A kind of call's key (op, shapes, dtype, thread count...) as the file writes it: its repr, which names the
    dtype and every size."""
    return repr(key)


class MeasuredStore:
    """The file of answers for this machine: read on the first question, merged and written by `flush`."""

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._kernels = ""  # `registered_kernels()` at the last entry of the mode
        self._kept: dict[str, Kept] | None = None  # read on first use
        self._new: dict[str, Kept] = {}
        self.notices: list[str] = []  # said once each: a file ignored

    def use_kernels(self, kernels: str) -> bool:
        """Answers for the CPU kernels `kernels` names (`registered_kernels()`) from now on; whether they changed (the
        process's answers were for others: the caller forgets them). Unwritten answers are written first."""
        if kernels == self._kernels:
            return False
        self.flush()
        with self._lock:
            changed, self._kernels, self._kept = bool(self._kernels), kernels, None
        return changed

    @property
    def path(self) -> Path:
        key = json.dumps({**machine_key(), "kernels": self._kernels}, sort_keys=True)
        folder = self._folder if self._folder is not None else cache_folder() / "invariant"
        return folder / f"rows-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"

    def get(self, key: tuple) -> Kept | None:
        with self._lock:
            if self._kept is None:
                self._kept = self._read()
            return self._kept.get(call_key(key))

    def put(self, key: tuple, kept: Kept) -> None:
        with self._lock:
            if self._kept is None:
                self._kept = self._read()
            self._kept[call_key(key)] = self._new[call_key(key)] = kept

    def take_notices(self) -> list[str]:
        """What is to be said of the file (once each), taken."""
        with self._lock:
            notices, self.notices = self.notices, []
        return notices

    def flush(self) -> None:
        """The new answers merged into the file (under a lock, written whole); nothing when there are none or the
        folder cannot be written (the next process measures them again)."""
        with self._lock:
            if not self._new:
                return
            new, self._new = self._new, {}
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path.parent / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                merged = {**self._read(quiet=True), **new}
                entries = {key: kept.as_json() for key, kept in merged.items()}
                write_text(path, json.dumps({"format": FORMAT, "machine": machine_key(), "kinds": entries}))
        except OSError:
            return

    def _read(self, quiet: bool = False) -> dict[str, Kept]:
        path = self.path
        if not path.exists():
            return {}
        try:
            return _parsed(read_json(path, MAX_BYTES, "the mode's measurements file"))
        except (InputError, ValueError, TypeError, KeyError) as exc:
            if not quiet:
                said = str(exc) if isinstance(exc, InputError) else f"the mode's measurements file {path} is damaged"
                self.notices.append(f"{said}: ignored; measured again and written anew")
            return {}  # (the next flush writes the file whole, without it)


def _parsed(data: object) -> dict[str, Kept]:
    """The file's answers, every field checked; ValueError, TypeError or KeyError for anything else (a file of
    another format or machine counts as damaged: its name says this machine's key)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("machine") != machine_key():
        raise ValueError("another format or machine")
    kinds = data["kinds"]
    if not isinstance(kinds, dict):
        raise TypeError
    return {key: _kept(value) for key, value in kinds.items()}


def _kept(value: dict) -> Kept:
    heights = value["heights"]
    if not isinstance(heights, dict) or not all(_height(h) for h in heights.values()):
        raise TypeError
    failed, unneeded = value["failed"], value["unneeded"]
    path, floor, ceiling = value["path"], value["floor"], value["ceiling"]
    if (
        not isinstance(path, str)
        or path not in heights
        or not _height(floor)
        or not (_height(ceiling) and ceiling is not None and ceiling <= 1024)
        or not isinstance(failed, list)
        or not all(isinstance(name, str) and name in heights for name in failed)
        or not isinstance(unneeded, list)
        or not all(isinstance(name, str) and name in heights for name in unneeded)
        or heights[path] != floor
    ):
        raise TypeError
    return Kept(path, floor, ceiling, dict(heights), tuple(failed), tuple(unneeded))


def _height(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024)


# The process's store: every `rows.choose` asks it before measuring.
store = MeasuredStore()
