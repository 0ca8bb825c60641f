"""torch: the private entry points the engine calls where the public ones cost more or hide what it needs."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SDPA", "TorchDispatchMode", "cpu_kernel_sites", "is_composite", "nn_binding", "onednn_linear_pointwise"]

# The C binding of scaled_dot_product_attention: a call past every Python mode (the mode's own SDPA, inside its mode).
SDPA = torch._C._nn.scaled_dot_product_attention


def nn_binding(name: str):
    """The Python binding of a `torch.nn.functional` op where torch has one in `torch._C._nn` (its `out=` form is
    the out overload: a third of the call's cost of `torch.ops.aten.<name>.out`); else None."""
    return getattr(torch._C._nn, name, None)


def onednn_linear_pointwise(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's inner product, `rows @ weight.T + bias`, as torch's CPU linear calls it (no fused post-op)."""
    return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")


def is_composite(op) -> bool:
    """Whether aten op `op` is a composite (made of other ops where autograd runs, as on a trainer's side)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def cpu_kernel_sites(op: str) -> list[str] | None:
    """Where each CPU kernel of op `op` ("aten::mm.out") was registered, the one in use first ("registered at
    FILE:LINE"; torch's own or a `torch.library` registration); None for an op this torch lacks."""
    try:
        dump = torch._C._dispatch_dump(op)
    except RuntimeError:
        return None
    lines = [line for line in dump.splitlines() if line.startswith(("CPU:", "CPU (inactive):"))]
    return [line.split(": ", 1)[1].split(" :: ")[0] for line in lines]
