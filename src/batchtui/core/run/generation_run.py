"""`generate_and_compare()`: does batching change what the model says, and from which token?

Each text is greedy-decoded twice with transformers' own `generate` (KV cache, `do_sample=False`), as a
user's code runs it: alone (batch of one, no padding) and as its row of a left-padded chunk (attention
mask; `generate` derives the positions from the mask). The first step where the chosen tokens differ is
the split; up to it both runs read the same prefix, so their next-token logits are compared like positions
(`position_stats`). After it they read different prefixes: that is reported as diverged, never as a logit
difference.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..compat.transformers import cache_kwarg, cache_of
from ..errors import InputError
from ..invariant.mode import invariant_if, outside_the_mode
from ..models.loading import LoadedModel
from ..numbers.comparison import PositionColumns
from ..numbers.generation_result import (
    DEFAULT_MAX_NEW_TOKENS,
    Continuation,
    DecodeVsPrefill,
    GenerationComparison,
    TextGeneration,
)
from ..numbers.metrics import position_stats
from ..numbers.trl_parts import TrlParts, summed
from ..settings import Settings
from .assemble import columns_by_text
from .backend import Backend, Decoded
from .module_outputs import first_differing, module_outputs
from .runner import Runner
from .sampler_vs_trainer import first_parting_places, logprobs_of
from .skeleton import CancelledFn, Chunk, PassSteps, PreparedRun, ProgressFn, own_tokens, prepare_run
from .trainer_forward import TRL, TrainerCall, trainer_call, trainer_modes, trl_parts_of

GENERATION_PADDING = "left"  # new tokens follow the prompt: right padding would put them after the pads


def generate_and_compare(
    texts: list[str] | tuple[str, ...],
    settings: Settings,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    from_embeds: bool = False,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
    lines: list[int] | None = None,
    logits_sink=None,
    vs_prefill: bool = False,
    vs_trainer: bool = False,
    ops: bool = False,
    trainer: str = "batchtui",
) -> GenerationComparison:
    """Greedy continuations of every text, batched (chunks of batch_size, left-padded) and alone.

    `from_embeds`: call `generate(inputs_embeds=...)`, the original report's path, instead of input ids.
    `logits_sink(index, single, batched)`: handed each text's per-step next-token logits of both runs ([steps, V]).
    `vs_prefill`: also set each decode step of the text alone against one forward of the sequence so far.
    `vs_trainer`: also score each batched continuation as a trainer does (`run.trainer_forward`) against the logprobs
    the batched decode gave its tokens (`numbers.importance`); with `ops`, where they part, the first op too;
    `trainer`: how the trainer calls the model (`trainer_forward.trainer_call`; with "trl", which of TRL's ways moves
    the logprobs too).
    """
    started = time.perf_counter()
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max new tokens must be a positive integer, not {max_new_tokens!r}")
    run = prepare_run(texts, settings, lines)
    settings, loaded = run.settings, run.loaded
    notes = list(loaded.notes)
    if settings.padding_side != GENERATION_PADDING:
        notes.append("generation pads on the left (new tokens follow the prompt); right padding is for check")
    runner = Runner(loaded, GENERATION_PADDING, "mask", max_tokens=settings.max_tokens, from_embeds=from_embeds)
    steps = run.steps(1 + vs_prefill + vs_trainer, progress, cancelled, "generation")
    call = trainer_call(trainer)
    generation = _Generation(
        loaded, runner, settings, max_new_tokens, steps, logits_sink, vs_prefill, vs_trainer, ops, call
    )
    results = run.guarded(lambda: generation.all(run))
    config = run.config
    config.update(
        padding_side=GENERATION_PADDING,
        positions="mask",
        max_new_tokens=max_new_tokens,
        from_embeds=from_embeds,
        vs_prefill=vs_prefill,
        vs_trainer=vs_trainer,
        ops=ops and vs_trainer,
        trainer=trainer if vs_trainer else None,
    )
    parts = summed(generation.trl_parts)
    return GenerationComparison(config, tuple(results), tuple(notes), time.perf_counter() - started, parts)


class _Generation:
    def __init__(
        self,
        loaded: LoadedModel,
        backend: Backend,
        settings: Settings,
        max_new_tokens,
        steps: PassSteps,
        sink,
        vs_prefill: bool,
        vs_trainer: bool,
        ops: bool,
        call: TrainerCall,
    ):  # fmt: skip
        self.loaded = loaded
        self.backend = backend
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.steps = steps
        self.eos_ids = set(backend.eos_ids)
        self.sink = sink  # handed each text's per-step logits of both runs, or None
        self.vs_prefill = vs_prefill
        self.vs_trainer = vs_trainer
        self.ops = ops  # with vs_trainer: the first op where the sampler and the trainer part
        self.call = call  # with vs_trainer: how the trainer calls the model
        self.trl_parts: list[TrlParts] = []  # with TRL's call: each chunk's

    def all(self, run: PreparedRun) -> list[TextGeneration]:
        results = []
        with (
            torch.inference_mode(),
            invariant_if(self.settings.invariant, self.loaded.model, self.settings.kernel_classes),
        ):
            for chunk in run.chunks():
                results += self._chunk(chunk)
        return results

    def _decode(self, rows: list[list[int]]) -> Decoded:
        self.steps.before()
        decoded = self.backend.greedy(rows, self.max_new_tokens, self.steps.is_cancelled)
        self.steps.after()
        return decoded

    def _chunk(self, chunk: Chunk) -> list[TextGeneration]:
        own = own_tokens(self.backend, chunk)
        for (ids, _), line in zip(own, chunk.lines):
            if len(ids) + self.max_new_tokens > self.loaded.max_tokens:
                raise InputError(
                    f"text {line}: {len(ids)} prompt tokens + {self.max_new_tokens} new tokens is more than the "
                    f"context of {self.loaded.name} ({self.loaded.max_tokens} positions)"
                )
        batched = self._decode([ids for ids, _ in own])
        trainer = self._trainer_vs_sampler([ids for ids, _ in own], batched) if self.vs_trainer else None
        results = []
        for row, (text, (ids, truncated)) in enumerate(zip(chunk.texts, own)):
            single = self._decode([ids])
            index = chunk.start + row
            result = self._measure(index, chunk.lines[row], text, ids, truncated, batched, row, single)
            if trainer is not None:
                sequence, module, op = trainer[row]
                result = dataclasses.replace(result, vs_trainer=sequence, vs_trainer_module=module, vs_trainer_op=op)
            results.append(result)
        return results

    def _trainer_vs_sampler(self, prompts: list[list[int]], batched: Decoded) -> list[tuple]:
        """Each row's continuation (up to its EOS) as the batched decode gave it, against the trainer's forward of
        the chunk's prompts + continuations (`run.sampler_vs_trainer`): (both logprobs of each token, the first module
        where they part, with `ops` the first op there)."""
        completions = [list(self._continuation(tokens).token_ids) for tokens in batched.new_tokens]
        self.steps.before()
        sequences = logprobs_of(self.loaded, prompts, completions, batched, self.call)
        if self.call == TRL:
            with trainer_modes(self.loaded.model):
                self.trl_parts.append(trl_parts_of(self.loaded.model, prompts, completions, self.loaded.pad_token_id))
        parted = {row: s.first_differing_step for row, s in enumerate(sequences) if s.first_differing_step is not None}
        places = first_parting_places(
            self.loaded,
            lambda: self.backend.greedy(prompts, self.max_new_tokens),
            prompts,
            completions,
            parted,
            self.ops,
            self.call,
        )
        self.steps.after()
        return [(sequence, *places.get(row, (None, None))) for row, sequence in enumerate(sequences)]

    def _measure(self, index, line, text, ids, truncated, batched: Decoded, row, single: Decoded) -> TextGeneration:
        batched_run = self._continuation(batched.new_tokens[row])
        single_run = self._continuation(single.new_tokens[0])
        shared = min(len(batched_run.token_ids), len(single_run.token_ids))
        split = next((i for i in range(shared) if batched_run.token_ids[i] != single_run.token_ids[i]), None)
        compared = shared if split is None else split + 1
        if self.sink is not None:
            self.sink(
                index,
                _model_logits(single.kept_logits[0, : len(single_run.token_ids)], self.loaded),
                _model_logits(batched.kept_logits[row, : len(batched_run.token_ids)], self.loaded),
            )
        # Step i's logits choose new token i; the token read at step i is the prompt's last, then the
        # single run's own (the same as the batched run's up to the split).
        fed = [ids[-1], *single_run.token_ids[: compared - 1]]
        with outside_the_mode():
            stats = position_stats(
                _model_logits(batched.kept_logits[row, :compared], self.loaded),
                _model_logits(single.kept_logits[0, :compared], self.loaded),
                self.settings.top_k,
                self.settings.atol,
                self.settings.rtol,
            )
        top_ids = torch.cat([stats.topk_batch_ids.flatten(), stats.topk_single_ids.flatten()]).tolist()
        chosen = [*batched_run.token_ids, *single_run.token_ids]  # the views show continuations token by token
        self.loaded.decode(sorted({*fed, *top_ids, *chosen}))
        columns = columns_by_text(stats, [compared])[0]
        prefill = self._decode_vs_prefill(ids, single_run, single) if self.vs_prefill else None
        return TextGeneration(
            index=index,
            line=line,
            text=text,
            prompt_tokens=len(ids),
            truncated=truncated,
            single=single_run,
            batched=batched_run,
            split_step=split,
            steps=PositionColumns.deferring(token_ids=tuple(fed), token_texts=self.loaded.token_texts, **columns),
            vs_prefill=prefill,
        )

    def _decode_vs_prefill(self, ids: list[int], run: Continuation, decoded: Decoded) -> DecodeVsPrefill:
        """The single run's decode steps against one forward of prompt + continuation (its last token needs none):
        the logits at position p of the prefill predict what decode step p - len(prompt) + 1 chose."""
        self.steps.before()
        n = len(run.token_ids)
        sequence = torch.tensor([ids + list(run.token_ids[: n - 1])], device=self.loaded.device)
        prefill = self.loaded.model(input_ids=sequence, attention_mask=torch.ones_like(sequence), use_cache=False)
        prefilled = prefill.logits[0, len(ids) - 1 : len(ids) - 1 + n].float()
        stepped = _model_logits(decoded.kept_logits[0, :n], self.loaded).float().to(prefilled.device)
        self.steps.after()
        apart = tuple((stepped - prefilled).abs().amax(dim=-1).tolist())
        first = next((step for step, d in enumerate(apart) if d != 0), None)
        where = None if first is None else self._first_module(ids, list(run.token_ids[: n - 1]), first)
        return DecodeVsPrefill(apart, where)

    def _first_module(self, prompt: list[int], continuation: list[int], step: int) -> str | None:
        """The first module (in run order) whose output for decode step `step` differs between the decode (the
        prompt's own prefill at step 0, else one token after the earlier positions' KV cache) and the prefill of
        prompt + continuation, at the same position."""
        device = self.loaded.device
        sequence = torch.tensor([prompt + continuation], device=device)
        position = len(prompt) - 1 + step
        model = self.loaded.model
        order = [m.name for m in self.loaded.structure.recorded(modules=True)]

        def at(position: int, **inputs) -> dict[str, torch.Tensor]:  # one forward; each module's output there
            return module_outputs(model, order, lambda: model(**inputs), {0: (0, 0, position)}).get(0, {})

        prefilled = at(position, input_ids=sequence, use_cache=False)
        if step == 0:
            decoded = at(-1, input_ids=sequence[:, : len(prompt)], use_cache=False)
        else:
            cached = cache_of(model(input_ids=sequence[:, :position], use_cache=True))
            token = sequence[:, position : position + 1]
            decoded = at(-1, input_ids=token, use_cache=True, **{cache_kwarg(model): cached})
        return first_differing(order, prefilled, decoded)

    def _continuation(self, new_tokens: torch.Tensor) -> Continuation:
        """The row's new tokens up to and including its first EOS (`generate` pads finished rows after it)."""
        tokens = new_tokens.tolist()
        end = next((i for i, token in enumerate(tokens) if token in self.eos_ids), None)
        if end is not None:
            tokens = tokens[: end + 1]
        text = self.loaded.tokenizer.decode(tokens, skip_special_tokens=False)
        return Continuation(tuple(tokens), text, end is not None)


def _model_logits(logits: torch.Tensor, loaded: LoadedModel) -> torch.Tensor:
    """`generate` hands logits over in float32; back in the model's dtype where that is exact, so that ulp
    and allclose mean what they mean for `check`."""
    dtype = loaded.model.dtype
    narrowed = logits.to(dtype)
    return narrowed if torch.equal(narrowed.to(logits.dtype), logits) else logits
