"""aten kernels replaced for the duration of a `with` block, and the library's own back after it."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch


class ScopedKernels:
    """Subclasses name their replacements in `kernels()`: (op name, dispatch key) -> function. Entries may nest
    and come from several threads: the first registers, the last out removes (op overrides are process-wide)."""

    _lock: threading.Lock
    _entered: int
    _library: torch.library.Library | None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._lock, cls._entered, cls._library = threading.Lock(), 0, None

    def kernels(self) -> dict[tuple[str, str], Callable]:
        raise NotImplementedError

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._entered == 0:
                library = torch.library.Library("aten", "IMPL")
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
                    for (name, key), fn in self.kernels().items():
                        library.impl(name, fn, key)
                cls._library = library
            cls._entered += 1
        return self

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._entered -= 1
            if cls._entered == 0 and cls._library is not None:
                cls._library._destroy()
                cls._library = None
