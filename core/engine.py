"""`compare()`: texts + settings in, a `Comparison` out. The one entry the CLI and TUI use."""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from .assemble import group_results
from .comparison import (
    Comparison,
    Decomposition,
    ReferenceErrors,
    TextResult,
)
from .errors import BatchtuiError, Cancelled, InputError, ModelLoadError, ResourceError, is_out_of_memory
from .invariant import invariant_if
from .metrics import block_elements, max_abs_diff
from .models import LoadedModel, first_line, load_model
from .runner import BatchedChunk, PassOutput, Runner
from .settings import Settings
from .texts import validate_texts

_DTYPE_REFUSED = re.compile(r"[Ee]xpected .*\bgot (Double|Float|Half|BFloat16)\b")

ProgressFn = Callable[[int, int], None]
CancelledFn = Callable[[], bool]


def passes_per_text(settings: Settings) -> int:
    """The single run, plus the padded-row and float64 reference runs when asked for."""
    return 1 + settings.decompose + settings.reference


def total_passes(n_texts: int, batch_size: int, per_text: int = 1) -> int:
    """One batched pass per chunk plus `per_text` passes per text."""
    return -(-n_texts // batch_size) + n_texts * per_text


def running_stage(done: int, n_texts: int, batch_size: int, per_text: int = 1) -> str:
    """The pass that runs after `done` have finished: 'batched pass 2/3' or 'single passes 5/12' (the text
    whose own passes run, of all texts). A chunk's batched pass comes first, then its texts' own passes."""
    n_chunks = -(-n_texts // batch_size)
    remaining = done
    for chunk in range(n_chunks):
        if remaining == 0:
            return f"batched pass {chunk + 1}/{n_chunks}"
        remaining -= 1
        in_chunk = min(batch_size, n_texts - chunk * batch_size)
        if remaining < in_chunk * per_text:
            return f"single passes {chunk * batch_size + remaining // per_text + 1}/{n_texts}"
        remaining -= in_chunk * per_text
    return "measuring"


def compare(
    texts: list[str] | tuple[str, ...],
    settings: Settings,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
    lines: list[int] | None = None,
) -> Comparison:
    """Run every text batched (in chunks of batch_size) and alone, and measure how they differ.

    `lines`: the line each text came from (a texts file's, the editor's), reported as `TextResult.line`;
    by default 1, 2, 3...
    """
    started = time.perf_counter()
    settings = settings.validated()
    texts = validate_texts(texts, lines)
    lines = list(lines) if lines else list(range(1, len(texts) + 1))
    if len(lines) != len(texts):
        raise ValueError(f"{len(lines)} line numbers for {len(texts)} texts")
    loaded = load_model(settings)
    check_fits_model(settings, loaded)
    reference = load_reference_model(settings) if settings.reference else None
    results = run_guarded(loaded, lambda: _run(texts, lines, settings, loaded, reference, progress, cancelled))
    return Comparison(
        config=resolved_config(settings, loaded),
        texts=tuple(replace(result, line=line) for result, line in zip(results, lines)),
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


def check_fits_model(settings: Settings, loaded: LoadedModel) -> None:
    """Settings the loaded model cannot honour, refused before any pass runs."""
    if settings.top_k > loaded.vocab_size:
        raise InputError(f"top-k must be at most the vocabulary size {loaded.vocab_size}, not {settings.top_k}")
    if settings.max_tokens is not None and settings.max_tokens > loaded.max_tokens:
        raise InputError(
            f"max tokens {settings.max_tokens} is above the context of {loaded.name} ({loaded.max_tokens} "
            "positions): refused, as positions past it are not what the model was built for"
        )


def run_guarded(loaded: LoadedModel, run: Callable[[], object]):
    """`run()`, with running out of memory or a dtype the kernels lack turned into a user-facing error."""
    failure = None
    try:
        return run()
    except RuntimeError as exc:
        failure = _failure(exc, loaded)
        if failure is None:
            raise
    # Raised here, outside the handler, so the run's tensors are already freed.
    _release_memory(loaded.device)
    raise failure


def _failure(exc: RuntimeError, loaded: LoadedModel) -> BatchtuiError | None:
    """The user-facing error for a run that failed for want of memory or of dtype support; None otherwise."""
    message = str(exc)
    if is_out_of_memory(exc):
        return ResourceError(
            f"out of memory on {loaded.device} ({first_line(exc)}): lower the batch size or the text length "
            "(--batch-size, --max-tokens); the run was stopped and its memory released"
        )
    # "... not implemented for 'BFloat16'", "Expected mat_a to be Float32 ... got Double": a kernel without this dtype.
    if "not implemented for" in message or "not supported" in message or _DTYPE_REFUSED.search(message):
        return InputError(f"dtype {loaded.dtype} is not usable on {loaded.device} here: {first_line(exc)}")
    return None


def _release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _run(texts, lines, settings, loaded, reference, progress, cancelled) -> list[TextResult]:
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
    runner = Runner(
        loaded, settings.padding_side, settings.positions, per_module=settings.modules, max_tokens=settings.max_tokens
    )
    with torch.inference_mode(), invariant_if(settings.invariant, loaded.model), runner:
        for start in range(0, len(texts), settings.batch_size):
            chunk_texts = texts[start : start + settings.batch_size]
            check_cancelled()
            own = own_tokens(runner, chunk_texts, lines[start:])
            chunk = runner.batched(chunk_texts)
            step()
            group: list[tuple] = []  # (row, text, tokens, single pass, extras) measured together
            for row, text in enumerate(chunk_texts):
                check_cancelled()
                own_ids, truncated = own[row]
                if chunk.real_rows(chunk.input_ids, row).tolist() != own_ids:
                    raise ModelLoadError(
                        f"text {lines[start + row]}: the tokenizer gives other tokens inside a batch than alone"
                    )
                single = runner.single(own_ids)
                step()
                extra = {"truncated": truncated}
                if settings.decompose:
                    check_cancelled()
                    extra["decomposition"] = _decompose(runner, chunk, row, single, settings)
                    step()
                if reference is not None:
                    check_cancelled()
                    extra["reference"] = _reference_errors(reference, own_ids, chunk, row, single)
                    step()
                group.append((row, text, own_ids, single, extra))
                # Measure once the group fills a metrics block (or the chunk ends): few ops for short
                # texts, and at most a block's worth of singles' logits held for long ones.
                rows_held = sum(len(member[2]) for member in group)
                if rows_held * loaded.vocab_size >= block_elements(single.logits.device) or row == len(chunk_texts) - 1:
                    results += _measure(start, group, chunk, loaded, runner, settings)
                    group = []
            del chunk  # free this chunk's logits before the next one
    return results


def own_tokens(runner: Runner, texts: list[str], lines: list[int]) -> list[tuple[list[int], bool]]:
    """Each text's own tokens (cut to max_tokens, and whether cut); InputError for a text the tokenizer turns
    into no token at all (a normalizer may drop every character of it): there is nothing to compare."""
    own = [runner.tokenize(text) for text in texts]
    for (ids, _), line in zip(own, lines):
        if not ids:
            raise InputError(f"text {line}: the tokenizer gives no token for it, so there is nothing to compare")
    return own


def _measure(start, group, chunk, loaded, runner, settings) -> list[TextResult]:
    rows, texts, token_ids, singles, extras = map(list, zip(*group))
    measured = group_results(start, rows, texts, token_ids, chunk, singles, loaded, runner, settings)
    return [replace(result, **extra) for result, extra in zip(measured, extras)]


def _decompose(runner: Runner, chunk: BatchedChunk, row: int, single: PassOutput, settings: Settings) -> Decomposition:
    batched = chunk.real_rows(chunk.output.logits, row)
    padded_logits = runner.padded_row(chunk, row).logits[0]
    padded = padded_logits[chunk.real_mask(row, padded_logits.device)]
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
    batched = chunk.real_rows(chunk.output.logits, row).to("cpu", torch.float64)
    return ReferenceErrors(
        batched=max_abs_diff(batched, exact),
        single=max_abs_diff(single.logits[0].to("cpu", torch.float64), exact),
    )


def resolved_config(settings: Settings, loaded: LoadedModel) -> dict:
    config = settings.as_dict()
    config.update(device=loaded.device, dtype=loaded.dtype, attn=loaded.attn, dtype_requested=settings.dtype)
    config["pad_token_id"] = loaded.pad_token_id
    config["vocab_size"] = loaded.vocab_size
    return config
