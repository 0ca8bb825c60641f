"""Process-wide changes held while any `with` block needs them: the first entry makes them, the last exit
undoes them (entries may nest and come from several threads)."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator

import torch


class SharedScope:
    """Subclasses make their change in `_install` and undo it in `_remove`; each subclass counts its own
    entries."""

    _lock: threading.Lock
    _entered: int

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._lock, cls._entered = threading.Lock(), 0

    def _install(self) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._entered == 0:
                self._install()
            cls._entered += 1
        return self

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._entered -= 1
            if cls._entered == 0:
                self._remove()


class ScopedKernels(SharedScope):
    """aten kernels replaced while entered: subclasses name them in `kernels()`, (op name, dispatch key) ->
    function. A kernel registration is process-wide, so each replacement asks `active()` and computes what the
    library computes in a thread that has not entered the block (the app's other workers, a baseline run)."""

    _library: torch.library.Library | None = None
    _threads: threading.local

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._threads = threading.local()

    @classmethod
    def active(cls) -> bool:
        """Whether the calling thread is inside a block of this scope."""
        return getattr(cls._threads, "depth", 0) > 0

    @classmethod
    @contextlib.contextmanager
    def paused(cls) -> Iterator[None]:
        """The library's own results for the calling thread inside the block, even where it entered this scope."""
        depth = getattr(cls._threads, "depth", 0)
        cls._threads.depth = 0
        try:
            yield
        finally:
            cls._threads.depth = depth

    def kernels(self) -> dict[tuple[str, str], Callable]:
        raise NotImplementedError

    def __enter__(self):
        super().__enter__()
        type(self)._threads.depth = getattr(type(self)._threads, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        type(self)._threads.depth -= 1
        super().__exit__(*exc)

    def _install(self) -> None:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
            for (name, key), fn in self.kernels().items():
                library.impl(name, fn, key)
        type(self)._library = library

    def _remove(self) -> None:
        type(self)._library._destroy()  # the library's own kernels are back
        type(self)._library = None
