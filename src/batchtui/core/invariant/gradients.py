"""The mode's forwards under autograd: the forward is the mode's, the backward the plain computation's.

The mode computes its rows through `out=` forms and kernels autograd has no formula for (oneDNN's inner product),
which refuse a tensor that requires grad. A trainer's forward runs with autograd on; its logits must be the mode's
bits, its gradients need not be (the backward is not batch-invariant: docs/invariant.md). So a call whose inputs
require grad runs the mode's function without recording, and its backward recomputes the plain, differentiable
function on the saved inputs and differentiates that (as activation checkpointing recomputes a layer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class _ModeForwardPlainBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable, plain: Callable, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.plain = plain
        ctx.save_for_backward(*inputs)
        return run(*inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(needs) for t, needs in zip(saved, ctx.needs_input_grad[2:])]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            out = ctx.plain(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ())
        return (None, None, *(next(grads) if t.requires_grad else None for t in inputs))


def plain_backward(run: Callable[..., torch.Tensor], plain: Callable[..., torch.Tensor], *inputs: torch.Tensor):
    """`run(*inputs)`; where autograd records and an input requires grad, with `plain`'s backward (see the module's
    doc). `plain` computes what `run` does in differentiable ops."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _ModeForwardPlainBackward.apply(run, plain, *inputs)
    return run(*inputs)
