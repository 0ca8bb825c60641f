"""`compare()`: texts + settings in, a `Comparison` out. The one entry the CLI and TUI use."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .assemble import MeasuredText, group_results, group_rows, group_stats, routing_changes
from .backend import PassOutput
from .comparison import Comparison, TextResult
from .errors import ModelLoadError
from .extra_passes import decomposition, load_reference_model, reference_errors
from .invariant import invariant_if, outside_the_mode
from .metrics import block_elements
from .models import LoadedModel
from .run_skeleton import (
    CancelledFn,
    Chunk,
    PassSteps,
    PreparedRun,
    ProgressFn,
    own_tokens,
    passes_per_text,
    prepare_run,
)
from .runner import Runner
from .settings import Settings

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
    with torch.inference_mode(), invariant_if(settings.invariant, loaded.model), runner:
        for chunk in run.chunks():
            results += _chunk(chunk, runner, settings, loaded, reference, steps, sink)
    return results


def _chunk(chunk: Chunk, runner: Runner, settings: Settings, loaded: LoadedModel, reference, steps: PassSteps, sink):
    results: list[TextResult] = []
    steps.before()
    own = own_tokens(runner, chunk)
    batched = runner.batched(chunk.texts)
    steps.after()
    batched_tokens = batched.real_token_ids()
    group: list[MeasuredText] = []  # texts measured together
    singles: list[PassOutput] = []
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
        group.append(measured)
        singles.append(single)
        # Measure once the group fills a metrics block (or the chunk ends): few ops for short texts, and at
        # most a block's worth of singles' logits held for long ones.
        rows_held = sum(len(m.token_ids) for m in group)
        if rows_held * loaded.vocab_size >= block_elements(single.logits.device) or row == len(chunk.texts) - 1:
            with outside_the_mode():
                stats = group_stats(group_rows(batched, [m.index - chunk.start for m in group], singles), settings)
                results += group_results(group, stats, loaded, runner.recording, settings)
            group, singles = [], []
    return results
