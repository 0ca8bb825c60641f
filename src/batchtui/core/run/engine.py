"""`compare()`: texts + settings in, a `Comparison` out. The one entry the CLI and TUI use."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..errors import ModelLoadError
from ..invariant.mode import invariant_if, outside_the_mode
from ..models.loading import LoadedModel
from ..numbers.comparison import Comparison, TextResult
from ..numbers.metrics import block_elements, block_rows
from ..settings import Settings
from .assemble import MeasuredText, group_results, group_rows, group_stats, routing_changes
from .backend import BatchedChunk, PassOutput
from .passes import decomposition, load_reference_model, reference_errors
from .runner import Runner
from .skeleton import (
    CancelledFn,
    Chunk,
    PassSteps,
    PreparedRun,
    ProgressFn,
    own_tokens,
    passes_per_text,
    prepare_run,
)

LogitsSink = Callable[[int, torch.Tensor, torch.Tensor], None]


def compare(
    texts: list[str] | tuple[str, ...],
    settings: Settings,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
    lines: list[int] | None = None,
    logits_sink: LogitsSink | None = None,
) -> Comparison:
    """Run every text batched (in chunks of batch_size) and alone, and measure how they differ.

    `lines`: the line each text came from (a texts file's, the editor's), reported as `TextResult.line`;
    by default 1, 2, 3... `logits_sink(index, single, batched)`: handed each text's logits alone and its batched
    row's at its real positions ([T, V] each, on the device; a sink that keeps them copies them).
    """
    started = time.perf_counter()
    run = prepare_run(texts, settings, lines)
    settings, loaded = run.settings, run.loaded
    reference = load_reference_model(settings) if settings.reference else None
    steps = run.steps(passes_per_text(settings), progress, cancelled, "comparison")
    results = run.guarded(lambda: _run(run, reference, steps, logits_sink))
    return Comparison(
        config=run.config,
        texts=tuple(results),
        notes=loaded.notes + _settings_notes(settings),
        elapsed_s=time.perf_counter() - started,
    )


def _settings_notes(settings: Settings) -> tuple[str, ...]:
    if settings.invariant and settings.positions == "arange" and settings.padding_side == "left":
        return (
            "arange positions with left padding give a padded text other positions than alone: a different "
            "computation, which the invariant mode cannot make equal (--positions mask can)",
        )
    return ()


def _run(run: PreparedRun, reference, steps: PassSteps, sink: LogitsSink | None) -> list[TextResult]:
    settings, loaded = run.settings, run.loaded
    runner = Runner(
        loaded, settings.padding_side, settings.positions, modules=settings.modules, max_tokens=settings.max_tokens
    )
    results: list[TextResult] = []
    with torch.inference_mode(), invariant_if(settings.invariant, loaded.model, settings.kernel_classes), runner:
        group = _Group(runner, settings, loaded)
        for chunk in run.chunks():
            results += _chunk(chunk, group, reference, steps, sink)
        results += group.measured()
    return results


class _Group:
    """Texts measured together, across chunks while their chunks' logits fill less than half a metrics block: each
    metric is then one set of ops for all of them. It is measured once its positions' logits fill a block (or the
    run ends): short texts share ops, and long ones over a large vocabulary never hold more than a block's worth of
    logits (and their chunks' batched outputs) at a time."""

    def __init__(self, runner: Runner, settings: Settings, loaded: LoadedModel) -> None:
        self.runner, self.settings, self.loaded = runner, settings, loaded
        self._reset()

    def _reset(self) -> None:
        self.texts: list[MeasuredText] = []
        self.singles: list[PassOutput] = []
        self.parts: list[tuple[BatchedChunk, list[int]]] = []  # each chunk's rows among the texts, in text order
        self.rows_held = 0

    def add(self, measured: MeasuredText, single: PassOutput, batched: BatchedChunk, row: int) -> list[TextResult]:
        """Hold one more text; the held texts' results once they fill a block. (Measuring the held texts before a
        text that would overflow their block spares a sliver of a block, but where a block holds only a text or two,
        as over a real vocabulary on a GPU, it makes twice the groups, each a set of ops of its own.)"""
        if not self.parts or self.parts[-1][0] is not batched:
            self.parts.append((batched, []))
        self.parts[-1][1].append(row)
        self.texts.append(measured)
        self.singles.append(single)
        self.rows_held += len(measured.token_ids)
        full = self.rows_held >= block_rows(single.logits.device, single.logits.shape[-1])
        return self.measured() if full else []

    def chunk_ended(self) -> list[TextResult]:
        """The held texts' results, unless their chunks' batched logits (padding and the rows of other groups
        included, all held while the group is) fill less than half a block: only then is the group carried into the
        next chunk, whose outputs it then holds too. (The tiny model's chunks are carried; an English chunk of 8 texts
        of up to 128 tokens, or any chunk over a real vocabulary, is not.)"""
        held = sum(chunk.output.logits.numel() for chunk, _ in self.parts)
        return self.measured() if self.texts and 2 * held >= block_elements(self.singles[-1].logits.device) else []

    def measured(self) -> list[TextResult]:
        """The held texts' results (none held: none); the group is then empty."""
        if not self.texts:
            return []
        with outside_the_mode():
            stats = group_stats(group_rows(self.parts, self.singles), self.settings)
            results = group_results(self.texts, stats, self.loaded, self.runner.recording, self.settings)
        self._reset()
        return results


def _chunk(chunk: Chunk, group: _Group, reference, steps: PassSteps, sink: LogitsSink | None) -> list[TextResult]:
    runner, settings = group.runner, group.settings
    results: list[TextResult] = []
    steps.before()
    own = own_tokens(runner, chunk)
    batched = runner.batched(chunk.texts)
    steps.after()
    batched_tokens = batched.real_token_ids()
    for row, text in enumerate(chunk.texts):
        steps.before()
        token_ids, truncated = own[row]
        if batched_tokens[row] != token_ids:
            raise ModelLoadError(f"text {chunk.lines[row]}: the tokenizer gives other tokens inside a batch than alone")
        single = runner.single(token_ids)
        steps.after()
        if sink is not None:
            sink(chunk.start + row, single.logits[0], batched.real_rows(batched.output.logits, row))
        measured = MeasuredText(
            chunk.start + row,
            chunk.lines[row],
            text,
            token_ids,
            truncated,
            padding=batched.attention_mask.shape[1] - len(token_ids),
            routing_changes=routing_changes(batched, row, single, runner.recording),
        )
        if settings.decompose:
            steps.before()
            measured.decomposition = decomposition(runner, batched, row, single, settings)
            steps.after()
        if reference is not None:
            steps.before()
            measured.reference = reference_errors(reference, token_ids, batched, row, single)
            steps.after()
        results += group.add(measured, single, batched, row)
    return results + group.chunk_ended()
