"""Forward passes exactly as DESIGN.md defines them: padded batches and unpadded singles.

Every pass goes through `inputs_embeds = model.get_input_embeddings()(input_ids)`, like the
user's own code, and records with forward hooks the hidden state after the embeddings, each decoder
layer (and its sub-modules) and the final norm, and the experts each MoE router chose, as the
model's `Structure` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .hf_compat import module_output
from .models import LoadedModel
from .structure import Module, chosen_experts


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
        """Row `row` of a [b, T, ...] tensor at its real (unpadded) positions, either padding side.

        The mask follows the tensor: a sharded model's logits may sit on another device than its inputs.
        """
        return tensor[row][self.real_mask(row, tensor.device)]

    def real_mask(self, row: int, device: torch.device) -> torch.Tensor:
        """A boolean mask over T selecting row `row`'s real tokens, on `device`."""
        return self.attention_mask[row].bool().to(device)


def position_ids(attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`mask`: cumsum(mask) - 1 with padded slots set to 1, as generate does; `arange`: the seed's."""
    if mode == "arange":
        length = attention_mask.shape[1]
        return torch.arange(length, device=attention_mask.device).expand(attention_mask.shape[0], -1)
    ids = attention_mask.long().cumsum(-1) - 1
    return ids.masked_fill(attention_mask == 0, 1)


# Tokens kept past the cut in a bounded prefix, so that the tokens before the cut are the whole text's (a
# tokenizer merges characters near the end of a prefix otherwise than inside the text).
_CUT_MARGIN = 64


class Runner:
    """Runs passes on one loaded model with one set of settings, hooks attached while in use."""

    def __init__(
        self,
        loaded: LoadedModel,
        padding_side: str,
        positions: str,
        per_module: bool = False,
        max_tokens: int | None = None,
    ):
        self.loaded = loaded
        self.max_tokens = max_tokens or loaded.max_tokens
        self.padding_side = padding_side
        self.positions = positions
        structure = loaded.structure
        # What each recorded hidden state is: the embeddings first, then the hooked modules in run order.
        self.recorded = [Module(structure.embedding, "embedding")] + structure.recorded(per_module)
        self.names = [m.name for m in self.recorded]
        # Per-layer view: the embeddings, each decoder layer's output and the final norm.
        self.layer_indices = [i for i, m in enumerate(self.recorded) if m.kind != "sub"]
        self.routers = list(structure.routers)
        self._captured: dict[str, torch.Tensor] = {}
        self._handles = []
        self._prefixes: dict[str, str] = {}

    def __enter__(self) -> Runner:
        modules = dict(self.loaded.model.named_modules())
        for module in self.recorded[1:]:
            self._handles.append(modules[module.name].register_forward_hook(partial(self._capture, module.name)))
        for _, name in self.routers:
            self._handles.append(modules[name].register_forward_hook(partial(self._capture_route, name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _capture(self, name: str, module, args, output) -> None:
        # A copy: a model may add into a module's output in place after the hook ran (Falcon adds its
        # attention output into the MLP's), which would rewrite what was recorded.
        self._captured[name] = module_output(output).clone()

    def _capture_route(self, name: str, module, args, output) -> None:
        self._captured[("route", name)] = chosen_experts(output, self.loaded.structure.experts_per_token)

    def tokenize(self, text: str) -> tuple[list[int], bool]:
        """The text's own tokens, cut to max_tokens, and whether they were cut."""
        text = self.bounded(text)
        ids = self.loaded.tokenizer(text)["input_ids"]
        if len(ids) <= self.max_tokens:
            return ids, False
        return self.loaded.tokenizer(text, truncation=True, max_length=self.max_tokens)["input_ids"], True

    def bounded(self, text: str) -> str:
        """`text`, or a prefix of it long enough to hold max_tokens tokens and a margin: what is cut away lies
        past the cut either way, and a 10 MB text costs the tokenizer a prefix's work, not the whole text's."""
        budget = (self.max_tokens + _CUT_MARGIN) * 8
        if budget >= len(text):
            return text
        if text not in self._prefixes:  # a text is cut for its single pass and again for its batch
            while budget < len(text):
                prefix = text[:budget]
                if len(self.loaded.tokenizer(prefix)["input_ids"]) >= self.max_tokens + _CUT_MARGIN:
                    break
                budget *= 4  # tokens of many characters each (runs of spaces, repeated words)
            if len(self._prefixes) >= 256:  # keys are the caller's own strings; the prefixes are bounded
                self._prefixes.clear()
            self._prefixes[text] = text[:budget]
        return self._prefixes[text]

    def batched(self, texts: list[str]) -> BatchedChunk:
        """Tokenize `texts` padded to their longest on the chosen side, then run them as one batch."""
        tokenizer = self.loaded.tokenizer
        saved_side = tokenizer.padding_side
        tokenizer.padding_side = self.padding_side
        try:
            bounded = [self.bounded(text) for text in texts]
            encoded = tokenizer(bounded, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        finally:
            tokenizer.padding_side = saved_side
        device = self.loaded.device
        input_ids = encoded["input_ids"].to(device)
        mask = encoded["attention_mask"].to(device)
        return BatchedChunk(input_ids, mask, self._forward(input_ids, mask))

    def padded_row(self, chunk: BatchedChunk, row: int) -> PassOutput:
        """Row `row` of a padded chunk, with its padding and mask, as a batch of one (the seed's single)."""
        return self._forward(chunk.input_ids[row : row + 1], chunk.attention_mask[row : row + 1])

    def single(self, token_ids: list[int]) -> PassOutput:
        """One text alone: batch of one, no padding, positions 0..n-1."""
        input_ids = torch.tensor([token_ids], device=self.loaded.device)
        return self._forward(input_ids, torch.ones_like(input_ids))

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> PassOutput:
        model = self.loaded.model
        embeds = model.get_input_embeddings()(input_ids)
        self._captured = {}
        logits = model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=position_ids(mask, self.positions),
            use_cache=False,
        ).logits
        captured, self._captured = self._captured, {}
        # A sharded model leaves hidden states on several devices: gather them where the logits are
        # (a no-op on one device). Sub-modules may see tokens flattened to [b*T, H]: back to [b, T, H].
        shape = input_ids.shape
        hidden = [embeds] + [captured[name] for name in self.names[1:]]
        hidden = [h.to(logits.device).reshape(*shape, -1) for h in hidden]
        routes = [captured[("route", name)].to(logits.device).reshape(*shape, -1) for _, name in self.routers]
        return PassOutput(logits, hidden, routes)
