"""TRL's fused LM head in the mode: a completion token's logprob in the loss computed as the sampler drew it.

TRL's trainers (1.16: GRPO, RLOO) score completions through `add_fused_lm_head`: with `fused_lm_head=True` the model's
forward projects the last hidden states through the head's weight in vocabulary tiles, folded into an online
log-sum-exp (`ChunkedLogProbFunction`), and never holds the logits. `generate` draws each token from softmax(z / T),
z the head layer's logits in float32. The two round otherwise (another product by the head's weight, the sums in
another order), so a token's logprob in the loss is not the one it was drawn with, however invariant the rest.

While `FusedHeadsAsSampled(model)` is entered, TRL's fused head computes the sampler's way: the rows through the
model's own head layer (the mode's rows: the bits `generate` got for them), the head's scaling and soft-capping as the
model's forward applies them, float32, divided by the temperature, `log_softmax`, the label's entry; `_ROWS` rows at a
time, each chunk recomputed in the backward rather than kept (TRL's head holds no logits either; a row's bits do not
depend on its chunk: the mode's promise). What TRL asks for besides (the entropy, log Σp², the mean logit, whether the
label is the top-1) comes from the same log-probabilities. Another TRL's head, called otherwise, is refused in one line
rather than computed another way. On exit TRL's own kernel is back.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import NotInvariant

_ROWS = 256  # rows of logits held at once
_HOME, _NAME = "trl.trainer.utils", "_ChunkedLogProbFunction"  # where TRL's fused forward looks its kernel up
# TRL 1.16's call: ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size,
# final_logit_softcapping, logit_scale, outputs)
_PARAMETERS = ("hidden", "weight", "bias", "targets", "temperature", "chunk_size", "final_logit_softcapping",
               "logit_scale", "outputs")  # fmt: skip
_EXTRAS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class FusedHeadsAsSampled:
    """While entered, TRL's fused head (where TRL is imported) computes `model`'s logprobs as its sampler does."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._home: object | None = None  # TRL's module, while its kernel is stood in for
        self._kernel: object | None = None

    def __enter__(self) -> FusedHeadsAsSampled:
        home = sys.modules.get(_HOME)
        if home is not None and hasattr(home, _NAME):
            self._home, self._kernel = home, getattr(home, _NAME)
            setattr(home, _NAME, _SampledLogProbs(self._model))
        return self

    def __exit__(self, *exc) -> None:
        if self._home is not None:
            setattr(self._home, _NAME, self._kernel)
            self._home = self._kernel = None


class _SampledLogProbs:
    """Stands in for TRL's `ChunkedLogProbFunction` (called as it is: `.apply(...)`)."""

    def __init__(self, model) -> None:
        self._head = model.get_output_embeddings()  # a transformers model's head layer (None where it has none)

    def apply(self, *args, **kwargs) -> tuple:
        if len(args) > len(_PARAMETERS) or set(kwargs) - set(_PARAMETERS):
            version = getattr(sys.modules.get("trl"), "__version__", "?")
            raise NotInvariant(
                f"TRL {version}'s fused LM head is called in a way the mode does not know (it knows TRL 1.16's): "
                "its logprobs would part from the sampler's"
            )
        bound = dict(zip(_PARAMETERS, args), **kwargs)
        return _logprobs(self._head, **{name: bound.get(name) for name in _PARAMETERS})


def _logprobs(head, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping, logit_scale,
              outputs) -> tuple:  # fmt: skip
    """TRL's five per-token outputs ([N] each, or None where not asked): logprob, entropy, log Σp², mean logit,
    top-1."""
    asked = tuple(outputs or ())
    own = head is not None and getattr(head, "weight", None) is weight

    def rows(h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = head(h) if own else torch.nn.functional.linear(h, weight, bias)
        if logit_scale is not None and logit_scale != 1.0:
            logits = logits * logit_scale
        if final_logit_softcapping is not None:
            logits = torch.tanh(logits / final_logit_softcapping) * final_logit_softcapping
        z = logits.float() / (temperature if temperature is not None else 1.0)  # the sampler's: `generate`'s warper
        logp = z.log_softmax(-1)
        columns = [logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0]]
        columns.append(torch.special.entr(logp.exp()).sum(-1) if "entropy" in asked else z.new_zeros(z.shape[0]))
        columns.append(torch.logsumexp(2 * logp, -1) if "log_sum_sq_probs" in asked else z.new_zeros(z.shape[0]))
        columns.append(z.mean(-1) if "mean_logits" in asked else z.new_zeros(z.shape[0]))
        columns.append((z.argmax(-1) == labels).float() if "is_top1" in asked else z.new_zeros(z.shape[0]))
        return torch.stack(columns, -1)

    pieces = []
    for start in range(0, hidden.shape[0], _ROWS):
        h, labels = hidden[start : start + _ROWS], targets[start : start + _ROWS]
        if torch.is_grad_enabled() and h.requires_grad:  # recomputed in the backward: no chunk's logits kept
            pieces.append(checkpoint(rows, h, labels, use_reentrant=False))
        else:
            pieces.append(rows(h, labels))
    table = torch.cat(pieces) if pieces else hidden.new_zeros((0, 5), dtype=torch.float32)
    logprobs = table[:, 0]
    entropy = table[:, 1] if "entropy" in asked else None
    extras = [table[:, 2 + i].detach() if name in asked else None for i, name in enumerate(_EXTRAS[1:])]
    extras[-1] = extras[-1].bool() if extras[-1] is not None else None
    return (logprobs, entropy, *extras)
