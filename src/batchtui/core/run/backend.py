"""The model a run's passes go through, as a small interface: a run asks it for tokens and passes and gets
tensors back, never a framework's objects. `Runner` (a transformers model in this process) implements it; a
served model answers what a server can: greedy continuations of a text (`Completer`), not hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the app imports this module for its served side, before its first frame: no torch there
    import torch

    from ..models.structure import Module


@dataclass(frozen=True)
class Recording:
    """What each recorded hidden state of a pass is: the embeddings first, then the hooked modules in run order;
    which of them make the per-layer view; and the MoE routers whose choices are recorded."""

    modules: tuple[Module, ...] = ()
    layer_indices: tuple[int, ...] = ()  # the embeddings, each decoder layer's output and the final norm
    routers: tuple[tuple[int, str], ...] = ()  # (layer, dotted name)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.modules]


@dataclass
class PassOutput:
    """One forward pass: logits [b, T, V], one hidden state [b, T, H] per recorded module (H may differ
    between modules), and per MoE router the experts chosen for each token, [b, T, k]."""

    logits: torch.Tensor
    hidden: list[torch.Tensor]
    routes: list[torch.Tensor]


@dataclass
class BatchedChunk:
    """A padded chunk of texts, run as one batch."""

    input_ids: torch.Tensor  # [b, T]
    attention_mask: torch.Tensor  # [b, T]
    output: PassOutput

    def real_rows(self, tensor: torch.Tensor, row: int) -> torch.Tensor:
        """Row `row` of a [b, T, ...] tensor at its real (unpadded) positions, either padding side: a view of
        `tensor` where they are one run, as padding on either side leaves them (read it, never write it), else a
        copy. The mask follows the tensor: a sharded model's logits may sit on another device than its inputs."""
        mask = self._mask_rows[row]
        start = mask.index(1) if 1 in mask else 0
        end = start + sum(mask)
        return tensor[row, start:end] if all(mask[start:end]) else tensor[row][self.real_mask(row, tensor.device)]

    def real_token_ids(self) -> list[list[int]]:
        """Each row's tokens at its real positions, on the host: one copy for the chunk, not one per row."""
        rows = zip(self.input_ids.tolist(), self._mask_rows)
        return [[token for token, real in zip(ids, mask) if real] for ids, mask in rows]

    @cached_property
    def host_mask(self) -> torch.Tensor:
        """The attention mask on the host ([b, T]), copied once for the chunk (on the CPU, the mask itself)."""
        return self.attention_mask.cpu()

    @cached_property
    def _mask_rows(self) -> list[list[int]]:  # the host mask as lists, for reading a row's run of real tokens
        return self.host_mask.tolist()

    def real_mask(self, row: int, device: torch.device) -> torch.Tensor:
        """A boolean mask over T selecting row `row`'s real tokens, on `device`."""
        return self.attention_mask[row].bool().to(device)


@dataclass
class Decoded:
    """One greedy decode of a batch of rows: each row's new tokens (before trimming at EOS) and each step's
    logits (None where the backend returns none)."""

    new_tokens: torch.Tensor  # [b, steps]
    logits: torch.Tensor | None  # [b, steps, V]

    @property
    def kept_logits(self) -> torch.Tensor:
        """`logits`, from a decode asked to keep them (`with_logits`)."""
        if self.logits is None:
            raise ValueError("this decode kept no step logits")
        return self.logits


class Backend(Protocol):
    """A model that answers a run's passes: tokens, a padded batch, a text alone, a padded row alone, greedy
    continuations. `recording` says what each pass's hidden states are."""

    recording: Recording

    @property
    def eos_ids(self) -> list[int]: ...  # the tokens that end a continuation

    def tokenize(self, text: str) -> tuple[list[int], bool]: ...

    def batched(self, texts: list[str]) -> BatchedChunk: ...

    def single(self, token_ids: list[int]) -> PassOutput: ...

    def padded_row(self, chunk: BatchedChunk, row: int) -> PassOutput: ...

    def greedy(
        self, rows: list[list[int]], max_new_tokens: int, cancelled=None, with_logits: bool = True
    ) -> Decoded: ...


@dataclass(frozen=True)
class ServedStep:
    """One generated token as the server reported it: the token, its logprob, the top alternatives (most
    likely first)."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class ServedContinuation:
    """One greedy completion. `steps` is None where the server returned no logprobs (then only the text is
    known); `prompt` holds, per prompt position, the server's prompt logprobs as (token, logprob) pairs (None
    where it returned none, vLLM's `prompt_logprobs`)."""

    text: str
    finish_reason: str | None
    steps: tuple[ServedStep, ...] | None
    prompt: tuple[tuple[tuple[str, float], ...] | None, ...] | None = None
    # Where the server gives them (vLLM's `return_token_ids`): the prompt's and the continuation's token ids, and
    # per prompt position the logprob of each token id it lists (the prompt's own token always among them).
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    prompt_by_id: tuple[dict[int, float] | None, ...] | None = None
    cached_tokens: int | None = None  # prompt tokens the server found in its prefix cache, where it says


class Completer(Protocol):
    """A model that continues a text (or token ids) greedily (temperature 0, a fixed seed), with the logprobs it
    can give and, asked for them, the token ids: a served model behind an OpenAI-compatible API
    (`endpoint.client.Endpoint`)."""

    def complete(
        self,
        text: str | list[int],
        max_new_tokens: int,
        top_logprobs: int = 0,
        prompt_logprobs: int = 0,
        token_ids: bool = False,
    ) -> ServedContinuation: ...
