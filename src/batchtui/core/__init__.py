"""batchtui's engine: batched-vs-single logit comparison, free of any UI.

`from batchtui.core import compare, Settings` is the public entry; `batch_invariant(model)` makes a model's
batched logits equal its single runs, bitwise. Submodules import torch lazily where
they can, so that the CLI's argument errors and the TUI's first frame come before torch loads.
"""

from .errors import BatchtuiError, Cancelled, InputError, ModelLoadError, NotInvariant
from .numbers.comparison import Comparison, ModuleMetrics, PositionMetrics, Summary, TextResult, TopToken
from .settings import Settings
from .texts import DEFAULT_TEXTS


def batch_invariant(model, classes=None):
    """See `batchtui.core.invariant.mode.batch_invariant`: `with batch_invariant(model): ...`; `classes`: only these
    of its parts (`check --explain kernels` names the fewest that do)."""
    from .invariant.mode import batch_invariant as _batch_invariant

    return _batch_invariant(model) if classes is None else _batch_invariant(model, tuple(classes))


def compare(*args, **kwargs):
    """See `batchtui.core.run.engine.compare`."""
    from .run.engine import compare as _compare

    return _compare(*args, **kwargs)


__all__ = [
    "DEFAULT_TEXTS",
    "BatchtuiError",
    "Cancelled",
    "Comparison",
    "InputError",
    "ModuleMetrics",
    "ModelLoadError",
    "NotInvariant",
    "PositionMetrics",
    "Settings",
    "Summary",
    "TextResult",
    "TopToken",
    "batch_invariant",
    "compare",
]
