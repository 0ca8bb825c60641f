"""Which of the mode's CPU kernels a model's passes never need, found from the model's own calls.

Every call of a replaced op crosses from aten's dispatcher into Python (12-20 µs inside a pass), those that then
run the library's own too: on a model of a few million weights a norm's mean and rsqrt were a third of what the
mode cost. On the CPU some calls never need the replacement, whatever the batch: an rsqrt in float32 or float64
(correctly rounded in the vector body and the scalar tail alike), a reduction over rows shorter than ATen's parallel
grain (only one row that long, alone, is split across threads). `needless_cpu_kernels` runs the model on a padded
batch of two rows and on a text alone, at two lengths, a prefill and a decoding step each, and records every call of
the replaced ops: an op whose calls were all of such kinds, and alike at both lengths (a row that grows with the
text is not), keeps the library's CPU kernel while the model is in the mode. An op it did not see keeps the replacement.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from ..compat.transformers import cache_kwarg, cache_of
from ..models.hooks import own_thread
from .scopes import ModuleForwards, ScopedKernels, library_holding

# Two prompt lengths: a reduction's row that depends on the text's length differs between them.
_LENGTHS = (4, 7)
# The kind of a call made inside a module the mode computes itself
_AT_THE_MODULE = ("at the module",)

Rule = Callable[..., Hashable | None]  # a call's arguments -> what makes it need nothing, None where it may


def needless_cpu_kernels(
    model: Any,  # a transformers causal LM (its embeddings, its cache's keywords)
    scopes: list[ScopedKernels],
    at_modules: Sequence[ModuleForwards] = (),
) -> frozenset[str]:
    """The ops of `scopes` with a rule (`needless_on_cpu`) that no CPU call of `model`'s passes needs replaced.
    The calls are caught where the mode's kernels are, at the CPU's dispatch key (those a composite op makes
    inside it too), and computed as outside the mode. A call made inside a module that one of `at_modules`
    computes itself in the mode (a linear layer, an activation) needs nothing: the mode does not reach the kernel."""
    seen: dict[str, tuple[set, ...]] = {}
    run = [0]  # which length's passes are under way
    inside: list[bool] = []  # for each module of `at_modules` under way, whether the mode computes its call itself

    def recording(name: str, rule: Rule, kernel: Callable) -> Callable:
        def kernel_and_record(*args, **kwargs):
            kind = _AT_THE_MODULE if any(inside) else rule(*args, **kwargs)
            seen.setdefault(name, tuple(set() for _ in _LENGTHS))[run[0]].add(kind)
            return kernel(*args, **kwargs)

        return kernel_and_record

    kernels = {
        (name, key): recording(name, scope.needless_on_cpu[name], kernel)
        for scope in scopes
        for (name, key), kernel in scope.kernels().items()
        if key == "CPU" and name in scope.needless_on_cpu
    }
    embeddings = model.get_input_embeddings()
    vocab, device = embeddings.weight.shape[0], embeddings.weight.device
    library = library_holding(kernels)  # in a thread outside the mode, the kernels compute the library's own
    hooks = _following(model, at_modules, inside)
    try:
        with torch.inference_mode():
            for index, length in enumerate(_LENGTHS):
                run[0] = index
                ids = torch.arange(1, 2 * length + 1, device=device).remainder(vocab).view(2, length)
                mask = torch.ones_like(ids)
                mask[0, 0] = 0  # a padded row: the mask's own code paths
                _prefill_and_step(model, ids, mask)
                _prefill_and_step(model, ids[1:], mask[1:])  # a text alone
    finally:
        library._destroy()
        for hook in hooks:
            hook.remove()
    return frozenset(name for name, runs in seen.items() if None not in runs[0] and runs[0] == runs[1])


def _following(model: torch.nn.Module, at_modules: Sequence[ModuleForwards], inside: list[bool]) -> list:
    """Hooks keeping `inside` as the modules of `at_modules` under way: for each, whether the mode's forward for it
    computes that call itself (not falling back to the module's own)."""
    hooks = []
    for forwards in at_modules:
        for module in model.modules():
            forward = forwards.forward_for(module)
            if forward is None:
                continue

            def enter(module, args, forwards=forwards, forward=forward) -> None:
                inside.append(forwards.computes_itself(forward, args))

            def leave(module, args, output) -> None:  # a hook's value would replace the output
                inside.pop()

            hooks.append(module.register_forward_pre_hook(own_thread(enter)))
            hooks.append(module.register_forward_hook(own_thread(leave), always_call=True))
    return hooks


def _prefill_and_step(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """A prefill of `ids` and, where the model returns a cache, one decoding step over it."""
    cache = cache_of(model(input_ids=ids, attention_mask=mask, use_cache=True))
    if cache is not None:
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        model(input_ids=ids[:, -1:], attention_mask=mask, use_cache=True, **{cache_kwarg(model): cache})
