"""`generate_and_compare()`: does batching change what the model says, and from which token?

Each text is greedy-decoded twice with transformers' own `generate` (KV cache, `do_sample=False`), as a
user's code runs it: alone (batch of one, no padding) and as its row of a left-padded chunk (attention
mask; `generate` derives the positions from the mask). The first step where the chosen tokens differ is
the split; up to it both runs read the same prefix, so their next-token logits are compared like positions
(`position_stats`). After it they read different prefixes: that is reported as diverged, never as a logit
difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from .assemble import columns_by_text
from .comparison import PositionColumns
from .engine import CancelledFn, ProgressFn, check_fits_model, own_tokens, resolved_config, run_guarded, total_passes
from .errors import Cancelled, InputError
from .generation_result import DEFAULT_MAX_NEW_TOKENS, Continuation, GenerationComparison, TextGeneration
from .invariant import invariant_if
from .metrics import position_stats
from .models import LoadedModel, load_model
from .runner import Runner
from .settings import Settings
from .texts import validate_texts

GENERATION_PADDING = "left"  # new tokens follow the prompt: right padding would put them after the pads


@dataclass
class _Decoded:
    """One `generate` call: the new tokens of each row (before trimming at EOS) and each step's logits."""

    new_tokens: torch.Tensor  # [b, steps]
    logits: torch.Tensor  # [b, steps, V]


class _StopWhenCancelled(StoppingCriteria):
    def __init__(self, cancelled: CancelledFn | None) -> None:
        self.cancelled = cancelled

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        stop = self.cancelled is not None and self.cancelled()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def generate_and_compare(
    texts: list[str] | tuple[str, ...],
    settings: Settings,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    from_embeds: bool = False,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
    lines: list[int] | None = None,
) -> GenerationComparison:
    """Greedy continuations of every text, batched (chunks of batch_size, left-padded) and alone.

    `from_embeds`: call `generate(inputs_embeds=...)`, the original report's path, instead of input ids.
    """
    started = time.perf_counter()
    settings = settings.validated()
    texts = validate_texts(texts, lines)
    lines = list(lines) if lines else list(range(1, len(texts) + 1))
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max new tokens must be a positive integer, not {max_new_tokens!r}")
    loaded = load_model(settings)
    check_fits_model(settings, loaded)
    notes = list(loaded.notes)
    if settings.padding_side != GENERATION_PADDING:
        notes.append("generation pads on the left (new tokens follow the prompt); right padding is for check")
    run = _Generation(loaded, settings, max_new_tokens, from_embeds, progress, cancelled)
    results = run_guarded(loaded, lambda: run.all(texts, lines))
    config = resolved_config(settings, loaded)
    config.update(
        padding_side=GENERATION_PADDING, positions="mask", max_new_tokens=max_new_tokens, from_embeds=from_embeds
    )
    return GenerationComparison(config, tuple(results), tuple(notes), time.perf_counter() - started)


class _Generation:
    def __init__(self, loaded: LoadedModel, settings: Settings, max_new_tokens, from_embeds, progress, cancelled):
        self.loaded = loaded
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.from_embeds = from_embeds
        self.progress = progress
        self.cancelled = cancelled
        self.runner = Runner(loaded, GENERATION_PADDING, "mask", max_tokens=settings.max_tokens)
        self.eos_ids = _eos_ids(loaded)
        self.done = 0
        self.total = 0

    def all(self, texts: list[str], lines: list[int]) -> list[TextGeneration]:
        self.total = total_passes(len(texts), self.settings.batch_size)
        results = []
        with torch.inference_mode(), invariant_if(self.settings.invariant, self.loaded.model):
            for start in range(0, len(texts), self.settings.batch_size):
                results += self._chunk(texts[start : start + self.settings.batch_size], lines, start)
        return results

    def _step(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("generation cancelled")
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _chunk(self, texts: list[str], lines: list[int], start: int) -> list[TextGeneration]:
        own = own_tokens(self.runner, texts, lines[start:])
        for (ids, _), line in zip(own, lines[start : start + len(texts)]):
            if len(ids) + self.max_new_tokens > self.loaded.max_tokens:
                raise InputError(
                    f"text {line}: {len(ids)} prompt tokens + {self.max_new_tokens} new tokens is more than the "
                    f"context of {self.loaded.name} ({self.loaded.max_tokens} positions)"
                )
        batched_ids, mask = _left_padded([ids for ids, _ in own], self.loaded)
        batched = self._decode(batched_ids, mask)
        self._step()
        results = []
        for row, (text, (ids, truncated)) in enumerate(zip(texts, own)):
            alone = torch.tensor([ids], device=self.loaded.device)
            single = self._decode(alone, torch.ones_like(alone))
            self._step()
            results.append(self._measure(start + row, lines[start + row], text, ids, truncated, batched, row, single))
        return results

    def _decode(self, input_ids: torch.Tensor, mask: torch.Tensor) -> _Decoded:
        model = self.loaded.model
        if self.from_embeds:  # the original report's path
            inputs = {"inputs_embeds": model.get_input_embeddings()(input_ids)}
        else:
            inputs = {"input_ids": input_ids}
        out = model.generate(
            **inputs,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            num_beams=1,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.loaded.pad_token_id,
            eos_token_id=sorted(self.eos_ids) or None,
            stopping_criteria=StoppingCriteriaList([_StopWhenCancelled(self.cancelled)]),
        )
        if self.cancelled is not None and self.cancelled():
            raise Cancelled("generation cancelled")
        # With inputs_embeds a decoder-only model's sequences hold only the new tokens.
        new_tokens = out.sequences if self.from_embeds else out.sequences[:, input_ids.shape[1] :]
        return _Decoded(new_tokens, torch.stack(out.logits, dim=1))

    def _measure(self, index, line, text, ids, truncated, batched: _Decoded, row, single: _Decoded) -> TextGeneration:
        batched_run = self._continuation(batched.new_tokens[row])
        single_run = self._continuation(single.new_tokens[0])
        shared = min(len(batched_run.token_ids), len(single_run.token_ids))
        split = next((i for i in range(shared) if batched_run.token_ids[i] != single_run.token_ids[i]), None)
        compared = shared if split is None else split + 1
        # Step i's logits choose new token i; the token read at step i is the prompt's last, then the
        # single run's own (the same as the batched run's up to the split).
        fed = [ids[-1], *single_run.token_ids[: compared - 1]]
        stats = position_stats(
            _model_logits(batched.logits[row, :compared], self.loaded),
            _model_logits(single.logits[0, :compared], self.loaded),
            self.settings.top_k,
            self.settings.atol,
            self.settings.rtol,
        )
        top_ids = torch.cat([stats.topk_batch_ids.flatten(), stats.topk_single_ids.flatten()]).tolist()
        chosen = [*batched_run.token_ids, *single_run.token_ids]  # the views show continuations token by token
        self.loaded.decode(sorted({*fed, *top_ids, *chosen}))
        columns = columns_by_text(stats, [compared])[0]
        return TextGeneration(
            index=index,
            line=line,
            text=text,
            prompt_tokens=len(ids),
            truncated=truncated,
            single=single_run,
            batched=batched_run,
            split_step=split,
            steps=PositionColumns(token_ids=tuple(fed), token_texts=self.loaded.token_texts, **columns),
        )

    def _continuation(self, new_tokens: torch.Tensor) -> Continuation:
        """The row's new tokens up to and including its first EOS (`generate` pads finished rows after it)."""
        tokens = new_tokens.tolist()
        end = next((i for i, token in enumerate(tokens) if token in self.eos_ids), None)
        if end is not None:
            tokens = tokens[: end + 1]
        text = self.loaded.tokenizer.decode(tokens, skip_special_tokens=False)
        return Continuation(tuple(tokens), text, end is not None)


def _eos_ids(loaded: LoadedModel) -> set[int]:
    """Every id that ends a sequence: the generation config's (one or a list) and the tokenizer's."""
    config_eos = getattr(getattr(loaded.model, "generation_config", None), "eos_token_id", None)
    ids = set(config_eos if isinstance(config_eos, list) else [config_eos])
    ids.add(loaded.tokenizer.eos_token_id)
    return {int(i) for i in ids if i is not None}


def _left_padded(token_ids: list[list[int]], loaded: LoadedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """The texts' own tokens, left-padded to the longest, with their attention mask."""
    longest = max(len(ids) for ids in token_ids)
    padded = [[loaded.pad_token_id] * (longest - len(ids)) + ids for ids in token_ids]
    mask = [[0] * (longest - len(ids)) + [1] * len(ids) for ids in token_ids]
    return torch.tensor(padded, device=loaded.device), torch.tensor(mask, device=loaded.device)


def _model_logits(logits: torch.Tensor, loaded: LoadedModel) -> torch.Tensor:
    """`generate` hands logits over in float32; back in the model's dtype where that is exact, so that ulp
    and allclose mean what they mean for `check`."""
    dtype = loaded.model.dtype
    narrowed = logits.to(dtype)
    return narrowed if torch.equal(narrowed.to(logits.dtype), logits) else logits
