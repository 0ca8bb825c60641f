"""The local backend: forward passes on a transformers model in this process, exactly as docs/metrics.md defines
them (padded batches, unpadded singles), and greedy continuations with transformers' own `generate`.

Every pass goes through `inputs_embeds = model.get_input_embeddings()(input_ids)`, like the
user's own code, and records with forward hooks the hidden state after the embeddings, each decoder
layer (and its sub-modules) and the final norm, and the experts each MoE router chose, as the
model's `Structure` names them.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ..compat.transformers import module_output
from ..errors import Cancelled
from ..invariant.positions import positions_from_mask
from ..models.loading import LoadedModel
from ..models.structure import Module, chosen_experts
from .backend import BatchedChunk, Decoded, PassOutput, Recording


def position_ids(attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """`mask`: cumsum(mask) - 1 with padded slots set to 1, as generate does; `arange`: the seed's."""
    if mode == "arange":
        length = attention_mask.shape[1]
        return torch.arange(length, device=attention_mask.device).expand(attention_mask.shape[0], -1)
    return positions_from_mask(attention_mask, attention_mask.shape[1])


def _placed(hidden: torch.Tensor, device: torch.device, shape: torch.Size) -> bool:
    """Whether a hidden state is already [b, T, H] on `device` (most are: two ops per module and pass saved)."""
    return hidden.device == device and hidden.dim() == 3 and hidden.shape[:2] == shape


# Tokens kept past the cut in a bounded prefix, so that the tokens before the cut are the whole text's (a
# tokenizer merges characters near the end of a prefix otherwise than inside the text).
_CUT_MARGIN = 64


class Runner:
    """The local `Backend`: passes on one loaded model with one set of settings, hooks attached while in use."""

    def __init__(
        self,
        loaded: LoadedModel,
        padding_side: str,
        positions: str,
        modules: bool = False,
        max_tokens: int | None = None,
        record: bool = True,
        from_embeds: bool = False,
    ):
        """`record`: hook the modules and keep their hidden states (off: logits only, the bare passes a
        bench's floor times). `from_embeds`: greedy continuations from `inputs_embeds`, the original
        report's path, instead of input ids."""
        self.loaded = loaded
        self.max_tokens = max_tokens or loaded.max_tokens
        self.padding_side = padding_side
        self.positions = positions
        self.from_embeds = from_embeds
        structure = loaded.structure
        if record:
            recorded = (Module(structure.embedding, "embedding"), *structure.recorded(modules))
            self.recording = Recording(
                modules=recorded,
                layer_indices=tuple(i for i, m in enumerate(recorded) if m.kind != "sub"),
                routers=tuple(structure.routers),
            )
        else:
            self.recording = Recording()
        self.names = self.recording.names
        # a module's output by its name; a router's chosen experts by ("route", its name)
        self._captured: dict[str | tuple[str, str], torch.Tensor] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._prefixes: dict[str, str] = {}
        self._eos_ids: list[int] | None = None

    def __enter__(self) -> Runner:
        modules = dict(self.loaded.model.named_modules())
        for module in self.recording.modules[1:]:
            self._handles.append(modules[module.name].register_forward_hook(partial(self._capture, module.name)))
        for _, name in self.recording.routers:
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
        per_token = self.loaded.structure.experts_per_token
        assert per_token is not None  # known wherever the structure found routers
        self._captured[("route", name)] = chosen_experts(output, per_token)

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
        input_ids, mask = self.padded(texts)
        return BatchedChunk(input_ids, mask, self._forward(input_ids, mask))

    def padded(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """`texts`' token ids padded to their longest on the chosen side, and the attention mask, on the device."""
        tokenizer = self.loaded.tokenizer
        saved_side = tokenizer.padding_side
        tokenizer.padding_side = self.padding_side
        try:
            bounded = [self.bounded(text) for text in texts]
            encoded = tokenizer(bounded, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        finally:
            tokenizer.padding_side = saved_side
        device = self.loaded.device
        return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)

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
        hidden = ([embeds] + [captured[name] for name in self.names[1:]]) if self.names else []  # none: logits only
        hidden = [h if _placed(h, logits.device, shape) else h.to(logits.device).reshape(*shape, -1) for h in hidden]
        routes = [captured[("route", name)].to(logits.device).reshape(*shape, -1) for _, name in self.recording.routers]
        return PassOutput(logits, hidden, routes)

    @property
    def eos_ids(self) -> list[int]:
        """Every id that ends a sequence: the generation config's (one or a list) and the tokenizer's."""
        if self._eos_ids is None:
            config_eos = getattr(getattr(self.loaded.model, "generation_config", None), "eos_token_id", None)
            ids = set(config_eos if isinstance(config_eos, list) else [config_eos])
            ids.add(self.loaded.tokenizer.eos_token_id)
            self._eos_ids = sorted(int(i) for i in ids if i is not None)
        return self._eos_ids

    def greedy(self, rows: list[list[int]], max_new_tokens: int, cancelled=None, with_logits: bool = True) -> Decoded:
        """Greedy continuations of the rows' tokens as one left-padded batch (one row: no padding), with
        transformers' `generate` (KV cache, `do_sample=False`) as a user's code calls it; each step's logits
        kept unless `with_logits` is off (a bench's floor: what a user's own call costs)."""
        input_ids, mask = self._left_padded(rows)
        model = self.loaded.model
        if self.from_embeds:  # the original report's path
            inputs = {"inputs_embeds": model.get_input_embeddings()(input_ids)}
        else:
            inputs = {"input_ids": input_ids}
        out = model.generate(
            **inputs,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            output_logits=with_logits,
            return_dict_in_generate=True,
            pad_token_id=self.loaded.pad_token_id,
            eos_token_id=self.eos_ids or None,
            stopping_criteria=StoppingCriteriaList([_StopWhenCancelled(cancelled)]),
        )
        if cancelled is not None and cancelled():
            raise Cancelled("generation cancelled")
        # With inputs_embeds a decoder-only model's sequences hold only the new tokens.
        new_tokens = out.sequences if self.from_embeds else out.sequences[:, input_ids.shape[1] :]
        return Decoded(new_tokens, torch.stack(out.logits, dim=1) if with_logits else None)

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' tokens, left-padded to the longest, with their attention mask."""
        longest = max(len(ids) for ids in rows)
        pad = self.loaded.pad_token_id
        padded = [[pad] * (longest - len(ids)) + ids for ids in rows]
        mask = [[0] * (longest - len(ids)) + [1] * len(ids) for ids in rows]
        device = self.loaded.device
        return torch.tensor(padded, device=device), torch.tensor(mask, device=device)


class _StopWhenCancelled(StoppingCriteria):
    def __init__(self, cancelled) -> None:
        self.cancelled = cancelled

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        stop = self.cancelled is not None and self.cancelled()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)
