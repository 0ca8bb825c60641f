"""The skeleton every run walks, whatever it measures and whatever model answers it: the texts and settings
checked and the model loaded once, then the texts in chunks of the batch size, each chunk's batched pass and
then each of its texts' own passes, with cancellation checked before every pass and progress said after it.

`compare` (logits), `generate_and_compare` (continuations) and `bench` (their floors) fill in the passes.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..errors import BatchtuiError, Cancelled, InputError, ResourceError, is_out_of_memory
from ..invariant.compiled_kernels import build_beside_loading
from ..models.loading import LoadedModel, first_line, load_model
from ..one_run import one_run_at_a_time
from ..settings import Settings
from ..texts import validate_texts
from .backend import Backend

ProgressFn = Callable[[int, int], None]
CancelledFn = Callable[[], bool]

_DTYPE_REFUSED = re.compile(r"[Ee]xpected .*\bgot (Double|Float|Half|BFloat16)\b")


@dataclass(frozen=True)
class Chunk:
    """The texts of one batched pass."""

    start: int  # the index of its first text among all texts
    texts: list[str]
    lines: list[int]  # the line each text came from


def chunks(texts: list[str], lines: list[int], batch_size: int) -> Iterator[Chunk]:
    for start in range(0, len(texts), batch_size):
        yield Chunk(start, texts[start : start + batch_size], lines[start : start + batch_size])


class PassSteps:
    """A run's passes counted: `before()` raises Cancelled once the caller cancelled, `after()` says progress."""

    def __init__(self, total: int, progress: ProgressFn | None, cancelled: CancelledFn | None, what: str) -> None:
        self.total = total
        self.done = 0
        self.progress = progress
        self.cancelled = cancelled
        self.what = what

    def is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled()

    def before(self) -> None:
        if self.is_cancelled():
            raise Cancelled(f"{self.what} cancelled")

    def after(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


def own_tokens(backend: Backend, chunk: Chunk) -> list[tuple[list[int], bool]]:
    """Each text's own tokens (cut to max_tokens, and whether cut); InputError for a text the tokenizer turns
    into no token at all (a normalizer may drop every character of it): there is nothing to compare."""
    own = [backend.tokenize(text) for text in chunk.texts]
    for (ids, _), line in zip(own, chunk.lines):
        if not ids:
            raise InputError(f"text {line}: the tokenizer gives no token for it, so there is nothing to compare")
    return own


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


def generation_stage(done: int, total: int, n_texts: int, batch_size: int, checks: tuple[str, ...]) -> str:
    """`running_stage` for a generation, whose passes past the continuations' are its `checks` ("decode vs prefill",
    "trainer vs sampler"): named with the count of all its steps, never a bare "measuring" for a minute."""
    stage = running_stage(done, n_texts, batch_size)
    if stage != "measuring" or not checks:
        return stage
    return f"{' and '.join(checks)}, step {min(done + 1, total)} of {total}"


@dataclass(frozen=True)
class PreparedRun:
    """What a run starts from, checked: the settings, the texts with their lines, and the loaded model."""

    settings: Settings
    texts: list[str]
    lines: list[int]
    loaded: LoadedModel

    def chunks(self) -> Iterator[Chunk]:
        return chunks(self.texts, self.lines, self.settings.batch_size)

    def steps(self, per_text: int, progress: ProgressFn | None, cancelled: CancelledFn | None, what: str):
        """The run's passes to count: a batched pass per chunk and `per_text` per text."""
        total = total_passes(len(self.texts), self.settings.batch_size, per_text)
        return PassSteps(total, progress, cancelled, what)

    def guarded(self, run: Callable[[], object]):
        """`run()` as `run_guarded` runs it."""
        return run_guarded(self.loaded, run)

    @property
    def config(self) -> dict:
        """The settings as the model resolved them."""
        return resolved_config(self.settings, self.loaded)


def prepare_run(texts: list[str] | tuple[str, ...], settings: Settings, lines: list[int] | None) -> PreparedRun:
    """Settings and texts checked before the model loads; the model loaded; settings it cannot honour refused.

    `lines`: the line each text came from (a texts file's, the editor's); by default 1, 2, 3...
    """
    settings = settings.validated()
    texts = validate_texts(texts, lines)
    lines = list(lines) if lines else list(range(1, len(texts) + 1))
    if len(lines) != len(texts):
        raise ValueError(f"{len(lines)} line numbers for {len(texts)} texts")
    build_beside_loading(settings)  # the mode's attention kernel (once a machine)
    loaded = load_model(settings)
    check_fits_model(settings, loaded)
    return PreparedRun(settings, texts, lines, loaded)


def check_fits_model(settings: Settings, loaded: LoadedModel) -> None:
    """Settings the loaded model cannot honour, refused before any pass runs."""
    if settings.top_k > loaded.vocab_size:
        raise InputError(f"top-k must be at most the vocabulary size {loaded.vocab_size}, not {settings.top_k}")
    if settings.max_tokens is not None and settings.max_tokens > loaded.max_tokens:
        raise InputError(
            f"max tokens {settings.max_tokens} is above the context of {loaded.name} ({loaded.max_tokens} "
            "positions): refused, as positions past it are not what the model was built for"
        )


def resolved_config(settings: Settings, loaded: LoadedModel) -> dict:
    """The settings as the model resolved them (its device, dtype, attention), for a report's config."""
    config = settings.as_dict()
    config.update(device=loaded.device, dtype=loaded.dtype, attn=loaded.attn, dtype_requested=settings.dtype)
    config["pad_token_id"] = loaded.pad_token_id
    config["vocab_size"] = loaded.vocab_size
    return config


def run_guarded(loaded: LoadedModel, run: Callable[[], object]):
    """`run()`, one at a time in the process (`one_run`), with running out of memory or a dtype the kernels lack turned
    into a user-facing error."""
    failure = None
    try:
        with one_run_at_a_time():
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
