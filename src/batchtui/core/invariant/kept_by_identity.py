"""A few values kept for the tensors they were found from, matched by identity: a pass's layers share one mask, so
what is read off it (which keys each query sees, where each row's keys start) is found once a pass. Tensors compare
element-wise, so the entries hold weak references: a tensor freed is never matched."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable


class KeptByIdentity:
    """The `size` most recent (tensor, key) -> value entries."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._entries: list[tuple[weakref.ref, Hashable, object]] = []

    def get(self, tensor, key: Hashable, make: Callable[[], object]):
        """The value kept for `tensor` (by identity) and `key`, else `make()`, kept."""
        for ref, known, value in self._entries:
            if ref() is tensor and known == key:
                return value
        value = make()
        self._entries.insert(0, (weakref.ref(tensor), key, value))
        del self._entries[self._size :]
        return value
