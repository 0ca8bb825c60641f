"""`measure_endpoint()`: does what else is in flight change a served model's greedy answer?

Each text is completed alone (nothing else in flight) twice, which measures run-to-run noise apart from
batching, then under load at each level of a concurrency ladder: `c` requests in flight at once (the texts in a
shuffled order, repeated where there are fewer texts than `c`), for `rounds` rounds so that each text meets other
neighbours. A fault stops the run and is kept with what was measured before it.
"""

from __future__ import annotations

import contextlib
import math
import queue
import random
import threading
import time
from collections.abc import Sequence

from ..errors import InputError, ModelLoadError, ResourceError
from ..numbers.generation_result import DEFAULT_MAX_NEW_TOKENS
from ..run.backend import Completer, ServedContinuation
from ..run.skeleton import CancelledFn, PassSteps, ProgressFn
from ..settings import Settings
from .checks import CACHE_UNKNOWN, NO_PREFILL, NotCompared, prefill_vs_decode, prefix_cache
from .client import DEFAULT_MAX_IN_FLIGHT, EndpointError
from .result import DEFAULT_LADDER, EndpointComparison, PrefillDecode, PrefixCacheCheck, ServedText
from .server_batch import BatchPoller, ServerBatch
from .vs_local import ServedVsLocal, served_vs_local

NO_LOGPROBS = "this server returns no logprobs: continuations compared as text only, steps counted in characters"
NO_PROMPT_LOGPROBS = "this server returns no prompt logprobs (vLLM's prompt_logprobs): the prompts are not compared"


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, not {value!r}")


# Requests a run may send at most (levels x texts x rounds and the rest): a ladder past it is refused, not started.
MAX_REQUESTS = 100_000


def request_count(levels, texts: int, rounds: int) -> int:
    """The requests a run sends: the probe; each text alone, then alone again `rounds` times (the server's own
    noise, as many tries as a level gets); the ladder; the served checks (prefill vs decode, the cache's two)."""
    return 1 + (1 + rounds) * texts + rounds * sum(max(c, texts) for c in levels) + 3 * texts


def check_ladder_bounds(levels, texts: int, rounds: int, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
    """InputError for a ladder past what this process may hold in flight (`max_in_flight`: a thread and a
    connection each) or past `MAX_REQUESTS` requests in all, before any request is sent."""
    top = max(levels, default=0)
    if top > max_in_flight:
        raise InputError(
            f"concurrency {top} is above --max-in-flight {max_in_flight}: each request in flight is a thread and a "
            "connection here; raise --max-in-flight to go higher"
        )
    total = request_count(levels, texts, rounds)
    if total > MAX_REQUESTS:
        raise InputError(
            f"the ladder would send {total} requests ({len(levels)} levels x {rounds} rounds over {texts} texts), "
            f"more than {MAX_REQUESTS}: give fewer levels, rounds or texts"
        )


def measure_endpoint(
    completer: Completer,
    texts: list[str],
    lines: list[int] | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    concurrency: int | Sequence[int] | None = None,
    rounds: int = 3,
    top_logprobs: int = 5,
    config: dict | None = None,
    progress: ProgressFn | None = None,
    cancelled: CancelledFn | None = None,
    local: Settings | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> EndpointComparison:
    """Alone, alone again `rounds` times, then `rounds` rounds under load at each concurrency of the ladder (one
    level or several; default `DEFAULT_LADDER`, at most `max_in_flight`). `config`: what the run reports it ran on
    (URL, model)."""
    started = time.perf_counter()
    levels = tuple(
        DEFAULT_LADDER if concurrency is None else [concurrency] if isinstance(concurrency, int) else concurrency
    )
    for name, value in (("max new tokens", max_new_tokens), ("rounds", rounds), *(("concurrency", c) for c in levels)):
        _positive(name, value)
    if not levels:
        raise InputError("the concurrency ladder needs at least one level")
    levels = tuple(sorted(set(levels)))  # lowest first, once each: the first level that breaks is the lowest
    check_ladder_bounds(levels, len(texts), rounds, max_in_flight)
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
        raise InputError(f"top logprobs must be 0 or more, not {top_logprobs!r}")
    lines = list(range(1, len(texts) + 1)) if lines is None else lines
    requests = request_count(levels, len(texts), rounds)
    steps = PassSteps(requests, progress, cancelled, "endpoint run")
    run = _EndpointRun(completer, texts, max_new_tokens, top_logprobs, steps, len(levels))
    failure = run.all(rounds, levels, lines, local)
    notes = []
    if run.logprobs is False:
        notes.append(NO_LOGPROBS)
    elif top_logprobs == 0:
        notes.append("--top-logprobs 0: continuations compared as text only, steps counted in characters")
    if top_logprobs and run.prompt_logprobs is False:
        notes.append(NO_PROMPT_LOGPROBS)
    notes += run.check_notes.values()
    notes += logprob_notes(run.answers())
    if failure is None and not run.check_notes and not all(run.prefill):
        notes.append(NO_PREFILL)
    if failure is None and any(c is not None and c.cached_tokens is None for c in run.cache):
        notes.append(CACHE_UNKNOWN)
    local_side = (
        None if local is None else {"model": local.model, "dtype": run.local_dtype, "invariant": local.invariant}
    )
    config = {
        **(config or {}),
        "max_new_tokens": max_new_tokens,
        "concurrency": list(levels),
        "rounds": rounds,
        "top_logprobs": top_logprobs,
        "temperature": 0,
        "seed": 0,
        "logprobs": bool(run.logprobs),
        "prompt_logprobs": bool(run.prompt_logprobs),
        "token_ids": bool(run.token_ids),
        "local": local_side,
        "steps_in": "tokens" if run.logprobs and top_logprobs else "characters",
    }
    results = tuple(
        ServedText(
            i,
            line,
            text,
            run.alone[i],
            run.again[i][0] if run.again[i] else None,
            tuple(tuple(level[i]) for level in run.loaded),
            run.prefill[i],
            run.cache[i],
            run.vs_local[i],
            tuple(run.again[i][1:]),
        )
        for i, (line, text) in enumerate(zip(lines, texts))
    )
    elapsed = time.perf_counter() - started
    return EndpointComparison(config, results, tuple(notes), elapsed, failure, tuple(run.server_batches))


class _RequestsInFlight:
    """Requests this process has sent and not yet seen answered, from any run. A run cancelled under load (the app,
    after an edit) leaves its requests to end by their deadline; the next run measures nothing alone until they
    have, or its "alone" would be measured beside them."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def one(self):
        with self._changed:
            self._count += 1
        try:
            yield
        finally:
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def wait_for_none(self, steps: PassSteps) -> None:
        """Until no request is in flight (each ends by its own deadline); Cancelled if the caller cancels first."""
        with self._changed:
            while self._count:
                steps.before()
                self._changed.wait(0.2)


_IN_FLIGHT = _RequestsInFlight()


def logprob_notes(answers) -> list[str]:
    """What the chosen tokens' logprobs in `answers` lack: steps with none (compared by token alone), and values
    that are not finite numbers (a move to or from one is infinite)."""
    chosen = [step.logprob for answer in answers if answer.steps is not None for step in answer.steps]
    missing = sum(lp is None for lp in chosen)
    odd = sum(lp is not None and not math.isfinite(lp) for lp in chosen)
    notes = []
    if missing:
        notes.append(
            f"the server gave no logprob for {missing} chosen tokens (token_logprobs null): those steps are compared "
            "by their tokens only"
        )
    if odd:
        notes.append(
            f"the server sent {odd} chosen-token logprobs that are not finite numbers (NaN or ±inf): a move to or "
            "from one counts as infinite"
        )
    return notes


class _EndpointRun:
    def __init__(
        self, completer: Completer, texts: list[str], max_new_tokens: int, top_k: int, steps: PassSteps, levels: int
    ):  # fmt: skip
        self.completer = completer
        self.texts = texts
        self.max_new_tokens = max_new_tokens
        self.top_k = top_k
        self.steps = steps
        self.logprobs: bool | None = None  # what the server gives back, found by the probe
        self.prompt_logprobs: bool | None = None
        self.token_ids: bool | None = None
        n = len(texts)
        self.alone: list[ServedContinuation | None] = [None] * n
        self.again: list[list[ServedContinuation]] = [[] for _ in range(n)]  # alone again, every round
        # Per level of the ladder, per text: its answers under load, every round.
        self.loaded: list[list[list[ServedContinuation]]] = [[[] for _ in range(n)] for _ in range(levels)]
        self.prefill: list[PrefillDecode | None] = [None] * n
        self.cache: list[PrefixCacheCheck | None] = [None] * n
        self.vs_local: list[ServedVsLocal | None] = [None] * n
        # Per served check, why it was not measured (the first text's reason: every text meets the same server).
        self.check_notes: dict[str, str] = {}
        read = getattr(completer, "metrics_text", None)  # (a server's Prometheus metrics, where the client reads them)
        self.batch_poller = BatchPoller(read) if read is not None else None
        self.server_batches: list[ServerBatch | None] = [None] * levels  # per level: the server's own batch
        self.local_dtype: str | None = None

    def answers(self) -> list[ServedContinuation]:
        """Every answer kept: alone, alone again, under load at every level."""
        again = [a for answers in self.again for a in answers]
        loaded = [a for level in self.loaded for answers in level for a in answers]
        return [a for a in (*self.alone, *again, *loaded) if a is not None]

    def all(self, rounds: int, levels: tuple[int, ...], lines: list[int], local: Settings | None) -> str | None:
        """Every run; returns the fault that stopped them, or None. With `local`, the alone runs go through that
        model right after they are made: one with another tokenizer, or answers whose ids do not fit it, stop the
        run before the ladder."""
        try:
            _IN_FLIGHT.wait_for_none(self.steps)
            self._probe()
            for number in range(1 + rounds):  # alone, then alone again as many times as a level is tried
                for i in range(len(self.texts)):
                    self.steps.before()
                    answer = self._complete(i)
                    if number == 0:
                        self.alone[i] = answer
                    else:
                        self.again[i].append(answer)
                    self.steps.after()
            if local is not None:
                from ..models.loading import load_model

                self.vs_local = served_vs_local(self.texts, lines, self.alone, local, self.max_new_tokens)
                self.local_dtype = load_model(local).dtype
            for level, concurrency in enumerate(levels):
                for number in range(rounds):
                    self._round(number, concurrency, self.loaded[level])
                if self.batch_poller is not None:
                    self.server_batches[level] = self.batch_poller.taken()
            self._served_checks()
        except (InputError, ModelLoadError, ResourceError) as exc:  # the server's fault, or the local check's
            return str(exc)
        return None

    def _served_checks(self) -> None:
        """Each text's prefill vs decode (where the server gives token ids and prompt logprobs) and prefix cache.
        A check the server answers with an HTTP error (a prompt past its context, say) is a note, not the run's
        fault: what was measured stands; a server that stops answering is a fault as anywhere."""
        for i, text in enumerate(self.texts):
            self.steps.before()
            if self.token_ids and self.prompt_logprobs and self.logprobs:
                self.prefill[i] = self._refused_as_note(
                    "prefill vs decode", prefill_vs_decode, self.completer, self.alone[i]
                )
            self.steps.after()
            self.steps.before()
            top = self.top_k if self.logprobs else 0
            self.cache[i] = self._refused_as_note(
                "the prefix cache", prefix_cache, self.completer, text, self.max_new_tokens, top
            )
            self.steps.after()
            self.steps.after()  # two requests: cold, then warm

    def _refused_as_note(self, check: str, run, *args):
        try:
            return run(*args)
        except NotCompared as exc:
            self.check_notes.setdefault(check, f"{check}: {exc}: not compared there")
            return None
        except EndpointError as exc:
            if exc.status is None:
                raise
            self.check_notes.setdefault(check, f"the server refused a request of {check} ({exc}): not measured there")
            return None

    def _probe(self) -> None:
        """Ask for logprobs and prompt logprobs once; a server that refuses a field is asked without it. What
        comes back says what the server gives (and the first request warms the server up)."""
        self.steps.before()
        k = self.top_k
        asks = [(k, k, True), (k, k, False), (k, 0, False), (0, 0, False)] if k else [(0, 0, True), (0, 0, False)]
        for number, (top, prompt, ids) in enumerate(asks):
            try:
                answer = self.completer.complete(self.texts[0], 1, top, prompt, ids)
            except EndpointError as exc:
                if exc.status not in (400, 422) or number == len(asks) - 1:
                    raise
                continue
            self.logprobs = answer.steps is not None and bool(top)
            self.prompt_logprobs = answer.prompt is not None and bool(prompt)
            self.token_ids = answer.token_ids is not None and answer.prompt_token_ids is not None
            break
        self.steps.after()

    def _complete(self, i: int) -> ServedContinuation:
        top = self.top_k if self.logprobs else 0
        prompt = self.top_k if self.prompt_logprobs else 0
        with _IN_FLIGHT.one():
            return self.completer.complete(self.texts[i], self.max_new_tokens, top, prompt, bool(self.token_ids))

    def _round(self, number: int, concurrency: int, kept: list[list[ServedContinuation]]) -> None:
        """`concurrency` requests in flight at once: every text in this round's shuffled order, repeated to fill
        the level where there are fewer texts. The workers are daemon threads: Ctrl+C or a fault ends the command
        at once, never waiting on a request still in flight."""
        shuffled = list(range(len(self.texts)))
        random.Random(number).shuffle(shuffled)
        order = [shuffled[k % len(shuffled)] for k in range(max(concurrency, len(shuffled)))]
        jobs: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in order:
            jobs.put(i)
        finished: queue.SimpleQueue = queue.SimpleQueue()

        def work() -> None:
            while True:
                try:
                    i = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    finished.put((i, self._complete(i), None))
                except Exception as exc:  # noqa: BLE001 - handed to the main thread, which raises it
                    finished.put((i, None, exc))

        self.steps.before()
        polling = self.batch_poller.polling() if self.batch_poller is not None else contextlib.nullcontext()
        with polling:
            self._in_flight(work, min(concurrency, len(order)), order, finished, jobs, kept)

    def _in_flight(self, work, workers: int, order, finished, jobs, kept) -> None:
        """The round's `workers` threads started and its answers collected into `kept`."""
        for _ in range(workers):
            threading.Thread(target=work, name="batchtui-endpoint", daemon=True).start()
        answers: list[tuple[int, ServedContinuation]] = []
        try:
            while len(answers) < len(order):
                self.steps.before()
                try:
                    i, answer, failure = finished.get(timeout=0.2)
                except queue.Empty:
                    continue
                if failure is not None:
                    raise failure
                answers.append((i, answer))
                self.steps.after()
        finally:
            while not jobs.empty():  # nothing new starts once the round ends early
                with contextlib.suppress(queue.Empty):
                    jobs.get_nowait()
        for i, answer in answers:
            kept[i].append(answer)
