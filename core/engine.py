"""`compare()`: texts + settings in, a `Comparison` out. The one entry the CLI and TUI use."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from core.comparison import (
    Comparison,
    Decomposition,
    LayerMetrics,
    PositionMetrics,
    ReferenceErrors,
    TextResult,
    TopToken,
)
from core.errors import Cancelled, InputError, ModelLoadError
from core.metrics import LayerStats, PositionStats, layer_stats, max_abs_diff, position_stats
from core.models import LoadedModel, load_model
from core.runner import BatchedChunk, PassOutput, Runner
from core.settings import Settings
from core.texts import validate_texts

ProgressFn = Callable[[int, int], None]
CancelledFn = Callable[[], bool]


def passes_per_text(settings: Settings) -> int:
    """The single run, plus the padded-row and float64 reference runs when asked for."""
    return 1 + settings.decompose + settings.reference


def total_passes(n_texts: int, batch_size: int, per_text: int = 1) -> int:
    """One batched pass per chunk plus `per_text` passes per text."""
    return -(-n_texts // batch_size) + n_texts * per_text


def describe_progress(done: int, n_texts: int, batch_size: int, per_text: int = 1) -> str:
    """'batched 1/2 · singles 3/5' after `done` passes (a chunk's pass, then its texts' own passes)."""
    n_chunks = -(-n_texts // batch_size)
    chunks_done = singles_done = 0
    remaining = done
    while remaining > 0 and chunks_done < n_chunks:
        chunks_done += 1
        remaining -= 1
        in_chunk = min(batch_size, n_texts - (chunks_done - 1) * batch_size)
        step = min(remaining, in_chunk * per_text)
        singles_done += step // per_text
        remaining -= step
    return f"batched {chunks_done}/{n_chunks} · singles {singles_done}/{n_texts}"


def compare(
    texts: list[str] | tuple[str, ...],
    settings: Settings,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
) -> Comparison:
    """Run every text batched (in chunks of batch_size) and alone, and measure how they differ."""
    started = time.perf_counter()
    settings = settings.validated()
    texts = validate_texts(texts)
    loaded = load_model(settings)
    if settings.top_k > loaded.vocab_size:
        raise InputError(f"top-k must be at most the vocabulary size {loaded.vocab_size}, not {settings.top_k}")
    reference = load_reference_model(settings) if settings.reference else None
    total = total_passes(len(texts), settings.batch_size, passes_per_text(settings))
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    def check_cancelled() -> None:
        if cancelled is not None and cancelled():
            raise Cancelled("comparison cancelled")

    results: list[TextResult] = []
    runner = Runner(loaded, settings.padding_side, settings.positions, per_module=settings.modules)
    with torch.inference_mode(), runner:
        for start in range(0, len(texts), settings.batch_size):
            chunk_texts = texts[start : start + settings.batch_size]
            check_cancelled()
            chunk = runner.batched(chunk_texts)
            step()
            for row, text in enumerate(chunk_texts):
                check_cancelled()
                token_ids = chunk.input_ids[row][chunk.real_positions(row)].tolist()
                own_ids = runner.tokenize(text)
                if token_ids != own_ids:
                    raise ModelLoadError(
                        f"text {start + row + 1}: the tokenizer gives other tokens inside a batch than alone"
                    )
                single = runner.single(own_ids)
                step()
                result = _text_result(start + row, text, own_ids, chunk, row, single, loaded, runner, settings)
                if settings.decompose:
                    check_cancelled()
                    result = replace(result, decomposition=_decompose(runner, chunk, row, single, settings))
                    step()
                if reference is not None:
                    check_cancelled()
                    result = replace(result, reference=_reference_errors(reference, own_ids, chunk, row, single))
                    step()
                results.append(result)
                del single
            del chunk  # free this chunk's logits before the next one
    return Comparison(
        config=_config(settings, loaded),
        texts=tuple(results),
        notes=loaded.notes,
        elapsed_s=time.perf_counter() - started,
    )


def _text_result(
    index: int,
    text: str,
    token_ids: list[int],
    chunk: BatchedChunk,
    row: int,
    single: PassOutput,
    loaded: LoadedModel,
    runner: Runner,
    settings: Settings,
) -> TextResult:
    real = chunk.real_positions(row)
    batched_logits = chunk.output.logits[row][real]
    single_logits = single.logits[0]
    stats = position_stats(batched_logits, single_logits, settings.top_k, settings.atol, settings.rtol)
    hidden = layer_stats([h[row][real] for h in chunk.output.hidden], [h[0] for h in single.hidden])
    modules = _layers(runner.names, hidden)
    positions = _positions(token_ids, stats, loaded)
    max_abs = stats.max_abs_diff
    return TextResult(
        index=index,
        text=text,
        token_ids=tuple(token_ids),
        tokens=tuple(loaded.token_text(t) for t in token_ids),
        allclose=bool(stats.allclose.all()),
        max_abs_diff=float(max_abs.max()),
        kl_max=float(stats.kl.max()),
        top1_flips=int(stats.top1_flip.sum()),
        worst_position=int(max_abs.argmax()),
        max_abs_diff_ulp=float(stats.max_abs_diff_ulp.max()),
        positions=positions,
        layers=tuple(modules[i] for i in runner.layer_indices),
        modules=modules if settings.modules else (),
    )


def _decompose(runner: Runner, chunk: BatchedChunk, row: int, single: PassOutput, settings: Settings) -> Decomposition:
    real = chunk.real_positions(row)
    batched = chunk.output.logits[row][real]
    padded = runner.padded_row(chunk, row).logits[0][real]
    alone = single.logits[0]
    tolerance = {"atol": settings.atol, "rtol": settings.rtol}
    return Decomposition(
        batch_effect=max_abs_diff(batched, padded),
        padding_effect=max_abs_diff(padded, alone),
        batch_effect_allclose=torch.allclose(batched, padded, **tolerance),
        padding_effect_allclose=torch.allclose(padded, alone, **tolerance),
    )


def load_reference_model(settings: Settings) -> LoadedModel:
    """The same checkpoint in float64 on the CPU; kept loaded beside the main model."""
    return load_model(settings.with_changes(dtype="float64", device="cpu"))


def _reference_errors(
    reference: LoadedModel, token_ids: list[int], chunk: BatchedChunk, row: int, single: PassOutput
) -> ReferenceErrors:
    with Runner(reference, "left", "mask") as ref_runner:
        exact = ref_runner.single(token_ids).logits[0]
    batched = chunk.output.logits[row][chunk.real_positions(row)].to("cpu", torch.float64)
    return ReferenceErrors(
        batched=max_abs_diff(batched, exact),
        single=max_abs_diff(single.logits[0].to("cpu", torch.float64), exact),
    )


def _positions(token_ids: list[int], stats: PositionStats, loaded: LoadedModel) -> tuple[PositionMetrics, ...]:
    columns = [
        stats.max_abs_diff.tolist(),
        stats.max_abs_diff_ulp.tolist(),
        stats.mean_abs_diff.tolist(),
        stats.kl.tolist(),
        stats.top1_flip.tolist(),
        stats.margin.tolist(),
        stats.allclose.tolist(),
    ]
    b_ids, s_ids = stats.topk_batch_ids.tolist(), stats.topk_single_ids.tolist()
    b_top = _top_tokens(
        b_ids, s_ids, stats.topk_batch_logits, stats.topk_batch_probs, stats.topk_batch_probs_in_single, loaded
    )
    s_top = _top_tokens(
        s_ids, b_ids, stats.topk_single_logits, stats.topk_single_probs, stats.topk_single_probs_in_batch, loaded
    )
    return tuple(
        PositionMetrics(
            index=t,
            token_id=token_id,
            token=loaded.token_text(token_id),
            max_abs_diff=max_abs,
            max_abs_diff_ulp=max_abs_ulp,
            mean_abs_diff=mean_abs,
            kl=kl,
            top1_flip=flip,
            margin=margin,
            allclose=close,
            topk_batch=b_top[t],
            topk_single=s_top[t],
        )
        for t, (token_id, max_abs, max_abs_ulp, mean_abs, kl, flip, margin, close) in enumerate(
            zip(token_ids, *columns)
        )
    )


def _top_tokens(ids, other_ids, logits, probs, probs_in_other, loaded: LoadedModel) -> list[tuple[TopToken, ...]]:
    rows = []
    for row in zip(ids, other_ids, logits.tolist(), probs.tolist(), probs_in_other.tolist()):
        row_ids, row_other, row_logits, row_probs, row_probs_in_other = row
        rank_in_other = {token_id: rank for rank, token_id in enumerate(row_other)}
        rows.append(
            tuple(
                TopToken(token_id, loaded.token_text(token_id), logit, prob, in_other, rank_in_other.get(token_id))
                for token_id, logit, prob, in_other in zip(row_ids, row_logits, row_probs, row_probs_in_other)
            )
        )
    return rows


def _layers(names: list[str], stats: LayerStats) -> tuple[LayerMetrics, ...]:
    return tuple(
        LayerMetrics(index=i, layer=name, max_abs_diff=max_abs, rel_l2=rel, bitwise_equal=equal)
        for i, (name, max_abs, rel, equal) in enumerate(
            zip(names, stats.max_abs_diff.tolist(), stats.rel_l2.tolist(), stats.bitwise_equal.tolist())
        )
    )


def _config(settings: Settings, loaded: LoadedModel) -> dict:
    config = settings.as_dict()
    config.update(device=loaded.device, dtype=loaded.dtype, attn=loaded.attn, dtype_requested=settings.dtype)
    config["pad_token_id"] = loaded.pad_token_id
    config["vocab_size"] = loaded.vocab_size
    return config
