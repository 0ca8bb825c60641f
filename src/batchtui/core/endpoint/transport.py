"""What a server may send back, bounded: every answer is read whole under a byte limit (counted after gzip or
deflate, the only encodings taken) and before the request's deadline, then handed to the client as it is. A server
that announces 8 GB, streams without end or sends one byte every few seconds is refused in one line.

The run's answers together are bounded too (`AnswerBudget`): an answer's bytes count from the first read until the
client has made it a continuation (parsed, it takes several times its size), so that 32 answers in flight, each
under the limit, never hold 32 times it.

It sits under the `openai` client as its HTTP transport; the HTTP library is the client's own (httpx, or httpx2 for
openai 3), found from the client's class so that one code serves both.
"""

from __future__ import annotations

import importlib
import threading
import time
import zlib

from ..untrusted import MiB

DEFAULT_MAX_ANSWER_MB = 64  # a completion with prompt logprobs for thousands of tokens is a few MB
RUN_BUDGET_ANSWERS = 2  # the answers of a run held at once: at most this many times the limit of one, together
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}


class AnswerRefused(Exception):
    """The answer broke a bound (size, time or encoding); the message says which, in words for the user."""


def http_library(openai_module):
    """The HTTP library the openai client is built on (`httpx` or `httpx2`)."""
    return importlib.import_module(openai_module.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])


class AnswerBudget:
    """The bytes of the answers a run holds at once, at most `total`: each thread's count from its answer's first
    read until `release()` (the caller's, once the answer is made into what it keeps)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._held = 0
        self._lock = threading.Lock()
        self._mine = threading.local()

    def take(self, size: int) -> None:
        """Count `size` more bytes for this thread; AnswerRefused past the total."""
        with self._lock:
            if self._held + size > self.total:
                raise AnswerRefused(
                    f"the answers in flight together are over {self.total / MiB:g} MiB ({RUN_BUDGET_ANSWERS} x "
                    "--max-answer-mb)"
                )
            self._held += size
        self._mine.bytes = getattr(self._mine, "bytes", 0) + size

    def release(self) -> None:
        """Give back every byte this thread counted."""
        mine = getattr(self._mine, "bytes", 0)
        self._mine.bytes = 0
        with self._lock:
            self._held -= mine

    @property
    def held(self) -> int:
        return self._held


class BoundedTransport:
    """An HTTP transport that reads each answer whole, at most `max_bytes` (decoded) and within `timeout_s` of the
    request's start, its bytes counted in the run's `budget`."""

    def __init__(self, inner, timeout_s: float, max_bytes: int, budget: AnswerBudget | None = None) -> None:
        self._inner = inner
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._budget = budget or AnswerBudget(RUN_BUDGET_ANSWERS * max_bytes)

    def handle_request(self, request):
        deadline = time.monotonic() + self._timeout_s
        request.headers["Accept-Encoding"] = "gzip, deflate"
        response = self._inner.handle_request(request)
        try:
            body = self._read(response, deadline)
        finally:
            response.close()
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _BODY_HEADERS]
        return type(response)(
            response.status_code, headers=headers, content=body, request=request, extensions=response.extensions
        )

    def _read(self, response, deadline: float) -> bytes:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity", *_DECODERS):
            raise AnswerRefused(f"the answer's encoding {encoding[:20]!r} is not one this client takes")
        announced = response.headers.get("Content-Length", "")
        if announced.strip().isdigit() and int(announced) > self._max_bytes and encoding in ("", "identity"):
            raise AnswerRefused(f"the answer announces {int(announced) / MiB:.0f} MiB, {self._limit()}")
        decoder = zlib.decompressobj(_DECODERS[encoding]) if encoding in _DECODERS else None
        parts, size = [], 0
        for chunk in response.stream:
            if time.monotonic() > deadline:
                raise AnswerRefused(f"no whole answer within {self._timeout_s:g} s (--timeout)")
            for part in _decoded(decoder, chunk, self._max_bytes - size + 1):
                size += len(part)
                if size > self._max_bytes:
                    raise AnswerRefused(f"the answer is {self._limit()}")
                self._budget.take(len(part))
                parts.append(part)
        if decoder is not None:
            parts.append(decoder.flush(self._max_bytes - size + 1))
            if size + len(parts[-1]) > self._max_bytes:
                raise AnswerRefused(f"the answer is {self._limit()}")
            self._budget.take(len(parts[-1]))
        return b"".join(parts)

    def _limit(self) -> str:
        return f"over the {self._max_bytes / MiB:g} MiB limit (--max-answer-mb)"

    def close(self) -> None:
        self._inner.close()

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._inner.__exit__(*exc_info)


_BODY_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def _decoded(decoder, chunk: bytes, room: int):
    """`chunk` as it is, or decompressed in pieces of at most `room` bytes (a bomb never expands past the limit)."""
    if decoder is None:
        yield chunk
        return
    try:
        while chunk:
            part = decoder.decompress(chunk, room)
            yield part
            chunk = decoder.unconsumed_tail
    except zlib.error:
        raise AnswerRefused("the answer's compressed body is corrupt") from None
