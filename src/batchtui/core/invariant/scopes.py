"""Process-wide changes held while any `with` block needs them: the first entry makes them, the last exit
undoes them (entries may nest and come from several threads)."""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

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


class ScopedKernels:
    """aten kernels replaced while entered: subclasses name them in `kernels()`, (op name, dispatch key) ->
    function. A kernel registration is process-wide, so each replacement asks `active()` and computes what the
    library computes in a thread that has not entered the block (the app's other workers, a baseline run).

    `library_on_cpu`: ops whose CPU kernel this entry leaves as it is (a model whose calls of them never need the
    replacement: `invariant.census`). A kernel is registered while any entry wants it (entries may nest and come
    from several threads, each wanting its own set); the registrations an entry adds are undone together once no
    entry wants any of them."""

    _lock: threading.Lock
    _threads: threading.local
    _wanted: dict[tuple[str, str], int]  # registration -> how many entries want it
    _libraries: list[tuple[torch.library.Library, frozenset]]  # each with the registrations it holds
    _now: frozenset[tuple[str, str]]  # the registrations in place, rewritten whole under the lock: read without it

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._lock, cls._threads, cls._wanted, cls._libraries = threading.Lock(), threading.local(), {}, []
        cls._now = frozenset()

    def __init__(self, library_on_cpu: frozenset[str] = frozenset()) -> None:
        self._library_on_cpu = library_on_cpu

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

    @classmethod
    def registered(cls) -> frozenset[tuple[str, str]]:
        """The (op name, dispatch key) pairs this scope's kernels replace now."""
        return cls._now

    @classmethod
    def replaces(cls, name: str, key: str) -> bool:
        """Whether op `name`'s kernel for dispatch key `key` is this scope's now (a lookup: asked on a call's way)."""
        return (name, key) in cls._now

    @classmethod
    def _held(cls) -> frozenset[tuple[str, str]]:  # under the lock
        return frozenset(key for _, keys in cls._libraries for key in keys)

    # op -> what makes a CPU call of it (its arguments) need no replacement whatever the batch, None where it may
    # (`invariant.census`); ops without a rule always may.
    needless_on_cpu: dict[str, Callable] = {}

    def kernels(self) -> dict[tuple[str, str], Callable]:
        raise NotImplementedError

    def __enter__(self):
        cls = type(self)
        kernels = {k: fn for k, fn in self.kernels().items() if not (k[1] == "CPU" and k[0] in self._library_on_cpu)}
        self._keys = frozenset(kernels)
        with cls._lock:
            missing = {key: fn for key, fn in kernels.items() if key not in cls._now}
            if missing:
                cls._libraries.append((library_holding(missing), frozenset(missing)))
            for key in self._keys:
                cls._wanted[key] = cls._wanted.get(key, 0) + 1
            cls._now = cls._held()
        cls._threads.depth = getattr(cls._threads, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        cls = type(self)
        cls._threads.depth -= 1
        with cls._lock:
            for key in self._keys:
                cls._wanted[key] -= 1
                if cls._wanted[key] == 0:
                    del cls._wanted[key]
            for entry in [e for e in cls._libraries if not any(key in cls._wanted for key in e[1])]:
                entry[0]._destroy()  # the library's own kernels are back
                cls._libraries.remove(entry)
            cls._now = cls._held()


# module -> the forward the mode gave it, while it has one
_given: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def has_own_forward(module: torch.nn.Module) -> bool:
    """Whether `module` has a forward of its own set on the instance (a monkeypatch, accelerate's hooks on every
    `device_map` model), not the mode's: the mode leaves such a layer to it (its products go through the mode's
    kernels) and never takes it away."""
    forward = vars(module).get("forward")
    return forward is not None and _given.get(module) is not forward


ForwardT = TypeVar("ForwardT", bound=Callable)


class ModuleForwards(Generic[ForwardT]):
    """Some modules of a model computing in a forward of the mode's while entered, by any thread: the first entry
    gives them theirs, the last exit takes them back (the class's own forward again); entries nest. Subclasses pick
    them: `forward_for(module)`, the forward a module takes, or None to leave it as it is."""

    _lock: threading.Lock
    # model -> [how many entries hold its modules' forwards, the modules given one, the undo of its `train`'s wrapping]
    _held: weakref.WeakKeyDictionary

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls._lock, cls._held = threading.Lock(), weakref.WeakKeyDictionary()

    def __init__(self, model: torch.nn.Module, modules: Sequence[torch.nn.Module] | None = None) -> None:
        # `modules`: the model's, where the caller has walked them already (on a model of many modules a walk is
        # what an entry costs)
        self._model, self._modules = model, modules

    @staticmethod
    def covers(module: torch.nn.Module) -> bool:
        """Whether `module` is one this class gives a forward (asked without making one)."""
        raise NotImplementedError

    def forward_for(self, module: torch.nn.Module) -> ForwardT | None:
        raise NotImplementedError

    def computes_itself(self, forward: ForwardT, args: tuple) -> bool:
        """Whether `forward` (one `forward_for` gave) computes a call of these arguments itself in the mode, rather
        than by the module's own forward."""
        return True

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            held = cls._held.get(self._model)
            if held is None:
                given = []
                for module in self._model.modules() if self._modules is None else self._modules:
                    forward = None if has_own_forward(module) else self.forward_for(module)
                    if forward is not None:
                        # an instance attribute as `module.forward = ...` sets it, without `nn.Module.__setattr__`'s
                        # look for a parameter, buffer or submodule of the name (none is "forward")
                        object.__setattr__(module, "forward", forward)
                        _given[module] = forward
                        given.append((module, forward))
                held = cls._held[self._model] = [0, given, _given_again_after_train(self._model, given)]
            held[0] += 1
        return self

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            held = cls._held[self._model]
            held[0] -= 1
            if held[0] == 0:
                for module, forward in held[1]:
                    # only the mode's own: a forward set on the layer inside the block (a hook added, a patch) stays
                    if vars(module).get("forward") is forward:
                        object.__delattr__(module, "forward")
                    if _given.get(module) is forward:
                        del _given[module]
                held[2]()  # the model's own `train` again
                del cls._held[self._model]


def _given_again_after_train(model: torch.nn.Module, given: list) -> Callable[[], None]:
    """While the returned undo is not called, `model.train(mode)` (and `eval()`, which calls it) gives the modules of
    `given` their mode's forward again where it took it: transformers' `train` re-kernelizes a model that uses hub
    kernels, which pops every decorated layer's instance forward (an activation's, a norm's). Returns the undo."""
    before = vars(model).get("train")  # an instance's own, as a patch sets it; None: the class's
    inner = model.train

    def train(mode: bool = True):
        result = inner(mode)
        for module, forward in given:
            if "forward" not in vars(module):
                object.__setattr__(module, "forward", forward)
        return result

    object.__setattr__(model, "train", train)

    def undo() -> None:
        if vars(model).get("train") is train:
            if before is None:
                object.__delattr__(model, "train")
            else:
                object.__setattr__(model, "train", before)

    return undo


def library_holding(kernels: dict[tuple[str, str], Callable]) -> torch.library.Library:
    """A library holding `kernels` ((op name, dispatch key) -> function) until its `_destroy()`."""
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for (name, key), fn in kernels.items():
            library.impl(name, fn, key)
    return library
