"""Forward hooks that act for the thread that added them alone.

A model is one object shared by every thread of the process, and a hook on one of its modules fires for every
thread's pass through it: the batch-invariant mode, entered in two threads at once, would count one thread's
passes as the other's."""

from __future__ import annotations

import threading
from collections.abc import Callable


def own_thread(hook: Callable) -> Callable:
    """`hook`, called only in the thread that made it; in any other it does nothing (returns None: a pre-hook
    leaves the arguments, a hook the output, as they are)."""
    owner = threading.get_ident()

    def in_owner(*args, **kwargs):
        if threading.get_ident() == owner:
            return hook(*args, **kwargs)
        return None

    return in_owner
