"""An OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, TGI, `transformers serve`) as a source of greedy
continuations: its `/v1/completions` API through the `openai` package (the `endpoint` extra).

Texts go only to the URL the user named: no redirects are followed and no proxy from the environment is used.
Requests are never retried, so a retry can never hide a changed answer. Every network or protocol fault is one
`EndpointError` line. A server is not trusted: each request ends by its deadline (connect and answer), each answer
is bounded in bytes (`endpoint.transport`), and the API key is read from the environment variable the user names
and scrubbed from everything the server says before it is shown or kept.
"""

from __future__ import annotations

import heapq
import os
import ssl
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import InputError
from ..untrusted import MiB
from ..visible import literal
from .transport import (
    DEFAULT_MAX_ANSWER_MB,
    RUN_BUDGET_ANSWERS,
    AnswerBudget,
    AnswerRefused,
    BoundedTransport,
    http_library,
)

if TYPE_CHECKING:  # the backend's types bring torch: loaded with the run, not with the command's parser
    from ..run.backend import ServedContinuation

DEFAULT_TIMEOUT_S = 120.0
GREEDY_SEED = 0
# Requests in flight at most: each is a thread here (and one for its deadline) and a connection of the pool.
DEFAULT_MAX_IN_FLIGHT = 256
_IDLE_S = 2.0  # seconds a connection may sit idle in the pool


class EndpointError(InputError):
    """The server could not be reached, or answered with an error or with something that is not an answer.
    `status`: the HTTP status of an error answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def base_url(url: str) -> str:
    """The API root of `url`: `http://host:8000` and `http://host:8000/v1` both name `http://host:8000/v1`."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - parsed on access: a port out of range or not a number raises here
    except ValueError as exc:
        raise InputError(f"--url {literal(url)!r} is not a valid address: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--url must be an http:// or https:// address, not {literal(url)!r}")
    if "@" in parts.netloc:
        raise InputError(
            "--url holds credentials (user:password@host), which are not sent: put the server's key in an "
            "environment variable and name it with --api-key-env"
        )
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def api_key_from(variable: str | None) -> str:
    """The key in environment variable `variable`; servers without authentication get a placeholder."""
    if not variable:
        return "EMPTY"
    key = os.environ.get(variable)
    if not key:
        raise InputError(f"environment variable {variable} (--api-key-env) is not set")
    return key


class Endpoint:
    """One server: its models, and greedy completions of a text (temperature 0, a fixed seed)."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_answer_mb: float = DEFAULT_MAX_ANSWER_MB,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ):  # fmt: skip
        try:
            import openai
        except ImportError:
            raise InputError("talking to a server needs the endpoint extra: pip install 'batchtui[endpoint]'") from None
        self.url = base_url(url)
        self.model = model
        self.timeout_s = timeout_s
        key = api_key_from(api_key_env)
        self._secrets = [key] if key != "EMPTY" else []
        http_lib = http_library(openai)
        # the pool as large as the most requests in flight (its default, 100, would queue the rest silently), and one
        # more: the server's metrics are read while a level holds every other connection (`endpoint.server_batch`)
        pool = max_in_flight + 1
        # An idle connection is let go after 2 s, before a server drops it (uvicorn's keep-alive, vLLM's, is 5 s;
        # httpx's own default is the same 5 s): a request sent down a connection the server is closing fails as
        # "disconnected", and requests are never retried.
        limits = http_lib.Limits(max_connections=pool, max_keepalive_connections=pool, keepalive_expiry=_IDLE_S)
        inner = http_lib.HTTPTransport(trust_env=False, retries=0, limits=limits)
        self.budget = AnswerBudget(RUN_BUDGET_ANSWERS * int(max_answer_mb * MiB))
        # httpx's transport interface, duck-typed (httpx is imported only where a run talks to a server)
        transport: Any = BoundedTransport(inner, timeout_s, int(max_answer_mb * MiB), self.budget)
        http = openai.DefaultHttpxClient(follow_redirects=False, timeout=timeout_s, transport=transport)
        self._http = http
        self._client = openai.OpenAI(base_url=self.url, api_key=key, timeout=timeout_s, max_retries=0, http_client=http)

    def scrubbed(self, text: str) -> str:
        """`text` (a server's words) with the API key replaced: a server may echo what it was sent."""
        for secret in self._secrets:
            text = text.replace(secret, "[api key]")
        return text

    def close(self) -> None:
        self._client.close()

    def metrics_text(self) -> str | None:
        """The server's Prometheus metrics (`/metrics` beside the API root, as vLLM serves them), or None where it
        has none or answers otherwise: never a fault of the run. Bounded as every answer is."""
        root = self.url.removesuffix("/v1")
        try:
            answer = self._http.get(f"{root}/metrics", timeout=min(self.timeout_s, 5.0))
            return self.scrubbed(answer.text) if answer.status_code == 200 else None
        except Exception:  # noqa: BLE001 - metrics are optional: any failure means none
            return None
        finally:
            self.budget.release()

    def served_models(self) -> list[str]:
        page = self._call(self._client.models.list)
        try:
            return [self.scrubbed(str(m.id)) for m in page.data]
        except (AttributeError, TypeError):
            raise EndpointError(f"{self.url}/models: the answer is not a list of models") from None

    def resolve_model(self) -> str:
        """The model to ask for: the one named, checked against the server's list; else the only one it serves."""
        served = self.served_models()
        named = ", ".join(literal(m, 80) for m in served[:20]) + (
            f" and {len(served) - 20} more" if len(served) > 20 else ""
        )
        if self.model is None:
            if len(served) != 1:
                raise InputError(f"{self.url} serves {len(served)} models ({named}): pick one with --model")
            self.model = served[0]
        elif self.model not in served:
            raise InputError(f"{self.url} does not serve model {literal(self.model, 80)!r} (it serves: {named})")
        return self.model

    def complete(
        self,
        text: str | list[int],
        max_new_tokens: int,
        top_logprobs: int = 0,
        prompt_logprobs: int = 0,
        token_ids: bool = False,
        temperature: float = 0.0,
        seed: int = GREEDY_SEED,
        tokens_as_ids: bool = False,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> ServedContinuation:
        """A completion of `text` (or of token ids): greedy by default, else sampled at `temperature` with `seed`
        (and `top_p` below 1, `top_k` above 0: the distribution truncated).
        `prompt_logprobs` and `token_ids` are vLLM's fields (`prompt_logprobs`, `return_token_ids`, and with
        `tokens_as_ids` the logprobs' tokens as `token_id:N`): a server that does not know them may refuse them."""
        extra = {"prompt_logprobs": prompt_logprobs} if prompt_logprobs else {}
        if token_ids:
            extra["return_token_ids"] = True
        if tokens_as_ids:
            extra["return_tokens_as_token_ids"] = True
        if top_k:
            extra["top_k"] = top_k  # vLLM's (and most servers'): not an OpenAI field
        keep = max(top_logprobs, prompt_logprobs) + 1  # what was asked (and the chosen token), never more

        def kept(answer) -> ServedContinuation:
            try:
                return continuation_from(
                    _only_choice(answer.choices), self.scrubbed, getattr(answer, "usage", None), keep
                )
            except (AttributeError, IndexError, KeyError, TypeError, ValueError):
                raise EndpointError(f"{self.url}/completions: the answer is not a completion") from None

        return self._call(
            self._client.completions.create,
            kept,
            model=self.model,
            prompt=text,
            max_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            **({"top_p": top_p} if top_p != 1.0 else {}),
            logprobs=top_logprobs or None,
            extra_body=extra or None,
        )

    def _call(self, method, kept=None, **kwargs):
        """`kept(method(**kwargs))` ended by the deadline whatever the server does (a request left behind ends
        within one more read: the transport checks the deadline between reads); its faults as one EndpointError
        line. The answer's bytes count in the run's budget until `kept` has made of it what is kept."""
        outcome: dict = {}

        def request() -> None:
            try:
                answer = method(**kwargs)
                outcome["answer"] = answer if kept is None else kept(answer)
            except Exception as exc:  # noqa: BLE001 - handed to the caller's thread, which words it
                outcome["fault"] = exc
            finally:
                self.budget.release()

        worker = threading.Thread(target=request, name="batchtui-request", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise EndpointError(f"{self.url}: no whole answer within {self.timeout_s:g} s (--timeout)")
        if "fault" in outcome:
            fault = outcome["fault"]
            raise (fault if isinstance(fault, EndpointError) else self._worded(fault)) from None
        return outcome["answer"]

    def _worded(self, exc: Exception) -> Exception:
        import openai

        refused = _cause(exc, AnswerRefused)
        if refused is not None:
            return EndpointError(f"{self.url}: {refused}")
        if isinstance(exc, openai.APITimeoutError):
            return EndpointError(f"{self.url}: no whole answer within {self.timeout_s:g} s (--timeout)")
        if isinstance(exc, openai.APIConnectionError):
            return EndpointError(f"{self.url}: {literal(self.scrubbed(_connection_fault(exc)))}")
        if isinstance(exc, openai.APIStatusError):
            detail = literal(self.scrubbed(_status_detail(exc)))[:200]
            return EndpointError(f"{self.url} answered HTTP {exc.status_code}: {detail}", exc.status_code)
        if isinstance(exc, (openai.APIResponseValidationError, ValueError)):  # ValueError: a body that is not JSON
            return EndpointError(f"{self.url}: the answer is not valid JSON of the OpenAI API")
        if isinstance(exc, RecursionError):  # JSON nested deeper than the parser's stack
            return EndpointError(f"{self.url}: the answer is nested too deep to be JSON of the OpenAI API")
        return exc


def _cause(exc: BaseException, kind: type) -> BaseException | None:
    """The first exception of `kind` in `exc`'s chain of causes."""
    found: BaseException | None = exc
    while found is not None and not isinstance(found, kind):
        found = found.__cause__ or found.__context__
    return found


def continuation_from(choice, scrubbed=str, usage=None, keep: int | None = None) -> ServedContinuation:
    """A `CompletionChoice` (the openai package's type, or vLLM's with `prompt_logprobs` and token ids) as a
    continuation, every string the server sent passed through `scrubbed`; `usage` gives the cached tokens."""
    from ..run.backend import ServedContinuation, ServedStep

    if not isinstance(choice.text, str):
        raise TypeError("no text")
    logprobs = choice.logprobs
    steps = None
    if logprobs is not None and logprobs.tokens is not None:
        chosen = logprobs.token_logprobs or [None] * len(logprobs.tokens)
        tops = logprobs.top_logprobs or [None] * len(logprobs.tokens)
        steps = tuple(
            ServedStep(scrubbed(str(token)), None if lp is None else _logprob(lp), _ranked(top, scrubbed, keep))
            for token, lp, top in zip(logprobs.tokens, chosen, tops, strict=True)
        )
    extra = getattr(choice, "model_extra", None) or {}
    prompt = extra.get("prompt_logprobs")
    prompt_steps = None if prompt is None else tuple(_prompt_position(p, scrubbed, keep) for p in prompt)
    reason = None if choice.finish_reason is None else scrubbed(str(choice.finish_reason))
    return ServedContinuation(
        scrubbed(choice.text),
        reason,
        steps,
        prompt_steps,
        _ids(extra.get("prompt_token_ids")),
        _ids(extra.get("token_ids")),
        None if prompt is None else tuple(_by_id(p, keep) for p in prompt),
        _cached_tokens(usage),
    )


def _only_choice(choices):
    """The one choice asked for (index 0): an answer with more, or with another index, is not its answer."""
    if len(choices) != 1 or choices[0].index != 0:
        raise ValueError("not one choice of index 0")
    return choices[0]


def _logprob(value) -> float:
    """A number the server sent as a logprob, as a float (NaN and infinities kept: the comparisons say them); a
    400-digit integer or anything but a number is not a logprob."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a logprob that is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError("a logprob past any float") from None


def _ids(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise TypeError("token ids that are not a list of integers")
    return tuple(value)


def _by_id(position: dict | None, keep: int | None = None) -> dict[int, float] | None:
    """vLLM's prompt logprobs at one position by token id (positions keyed otherwise give none), the `keep` most
    likely at most."""
    if position is None:
        return None
    found = {}
    for key, entry in position.items():
        if str(key).isdigit():
            found[int(key)] = _logprob(entry["logprob"] if isinstance(entry, dict) else entry)
    return found if keep is None else dict(_most_likely(found.items(), keep))


def _most_likely(pairs, keep: int | None) -> list:
    """(token, logprob) pairs, most likely first, the `keep` most likely at most (None: all): a server may send a
    million per step; the checks need what they asked for."""
    if keep is None:
        return sorted(pairs, key=lambda pair: -pair[1])
    return heapq.nlargest(keep, pairs, key=lambda pair: pair[1])


def _cached_tokens(usage) -> int | None:
    """The prompt tokens the server says it took from its cache; None where it says nothing believable (a count
    past any prompt, 10**30, is not a count)."""
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    prompt = getattr(usage, "prompt_tokens", None)
    if not isinstance(cached, int) or isinstance(cached, bool) or not 0 <= cached < _MOST_TOKENS:
        return None
    if isinstance(prompt, int) and not isinstance(prompt, bool) and cached > prompt:
        return None
    return cached


_MOST_TOKENS = 10**9  # more tokens than any prompt a server takes


def _ranked(top: dict | None, scrubbed, keep: int | None = None) -> tuple[tuple[str, float], ...]:
    if not top:
        return ()
    return tuple((scrubbed(str(t)), lp) for t, lp in _most_likely(((t, _logprob(lp)) for t, lp in top.items()), keep))


def _prompt_position(position: dict | None, scrubbed, keep: int | None = None) -> tuple[tuple[str, float], ...] | None:
    """vLLM's prompt logprobs at one position: {token id: {logprob, rank, decoded_token}} (None at the first)."""
    if position is None:
        return None
    pairs = []
    for token_id, entry in position.items():
        if isinstance(entry, dict):
            pairs.append((entry.get("decoded_token") or token_id, _logprob(entry["logprob"])))
        else:
            pairs.append((token_id, _logprob(entry)))
    return tuple((scrubbed(str(token)), lp) for token, lp in _most_likely(pairs, keep))


def _connection_fault(exc: BaseException) -> str:
    """What went wrong under the client's generic 'Connection error.': refused, TLS, a dropped connection."""
    cause = exc
    while (deeper := cause.__cause__ or cause.__context__) is not None:
        cause = deeper
        if isinstance(cause, ssl.SSLError):
            return f"TLS failure: {literal(str(cause))[:200]}"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (is the server running on that port?)"
    words = literal(str(cause)).strip() or type(cause).__name__
    if "refused" in words.lower():
        return "connection refused (is the server running on that port?)"
    if "disconnected" in words.lower() or "closed" in words.lower() or "incomplete" in words.lower():
        return f"the server closed the connection before answering ({words[:160]})"
    return f"cannot connect: {words[:200]}"


def _status_detail(exc) -> str:
    """The server's own words for an HTTP error, from `{"detail": ...}` (FastAPI) or `{"error": {"message": ...}}`."""
    body = exc.body
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("message") or body.get("error")
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        body = detail
    return literal(str(body if body is not None else exc.message))[:200]
