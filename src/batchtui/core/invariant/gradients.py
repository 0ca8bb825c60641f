"""The mode's forwards under autograd: the forward is the mode's, the backward the plain computation's.

The mode computes its rows through `out=` forms and kernels autograd has no formula for (oneDNN's inner product),
which refuse a tensor that requires grad. A trainer's forward runs with autograd on; its logits must be the mode's
bits, its gradients need not be (the backward is not batch-invariant: docs/invariant.md). So a call whose inputs
require grad runs the mode's function without recording, and its backward recomputes the plain, differentiable
function on the saved inputs and differentiates that (as activation checkpointing recomputes a layer). A linear
layer's backward needs none of its forward: `linear_plain_backward` computes its gradients from the saved rows and
weight directly (the products autograd's own backward of `F.linear` makes), without computing the layer again.
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


class _LinearPlainBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run: Callable, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return run()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        wants_x, wants_weight, wants_bias = ctx.needs_input_grad[1:4]
        rows = grad.reshape(-1, grad.shape[-1])
        grad_x = grad.matmul(weight) if wants_x else None
        grad_weight = rows.t().mm(x.reshape(-1, x.shape[-1])) if wants_weight else None
        grad_bias = rows.sum(0) if ctx.has_bias and wants_bias else None
        return None, grad_x, grad_weight, grad_bias


def linear_plain_backward(
    run: Callable[[], torch.Tensor], x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`run()`, the mode's `F.linear(x, weight, bias)`; where autograd records and an input requires grad, with the
    linear layer's gradients computed from `x` and `weight` (nothing of the forward computed again)."""
    inputs = (x, weight) if bias is None else (x, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _LinearPlainBackward.apply(run, x, weight, bias)
    return run()
