"""`endpoint --save-rollouts`: rollouts sampled from an OpenAI-compatible server, written as `batchtui rollouts`
reads them, so that one machine samples and another scores.

Each prompt (a texts file's line, or a JSONL line's `prompt` or `prompt_ids`, read streaming: a file of any length)
is completed `samples` times at `temperature` (and `top_p`, `top_k`: each line says all three), up to `concurrency`
requests in flight, the lines in the prompts' order; sample k of prompt i with seed `seed + i * samples + k` (the same
file and seed sample the same rollouts on a server that honours seeds). The server must give token ids (vLLM's
`return_token_ids`, and its logprobs' tokens as `token_id:N`): the prompt's and the completion's ids, the logprob of
each chosen token and its top-1. What it sends is checked as any answer from elsewhere; a line is written with one
`write` on a file that did not exist.
"""

from __future__ import annotations

import collections
import json
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..texts import read_text_lines
from ..visible import literal
from .client import Endpoint, EndpointError

_TOKEN_ID = "token_id:"
_MAX_VOCABULARY = 2**31  # no tokenizer has more ids (the largest have a few hundred thousand)


@dataclass(frozen=True)
class Prompt:
    line: int
    text: str | None
    ids: list[int] | None

    @property
    def sent(self) -> str | list[int]:
        """What the server is sent: the ids where the file gives them, else the text (a prompt has one of them)."""
        if self.ids is not None:
            return self.ids
        assert self.text is not None
        return self.text


@dataclass(frozen=True)
class Sampling:
    """What a rollout is sampled with, written into each line (`rollouts` scores at its temperature and says where
    the distribution was truncated)."""

    temperature: float
    top_p: float = 1.0  # 1: no nucleus cut
    top_k: int = 0  # 0: no top-k cut

    def as_json(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def read_prompts(path: str) -> Iterator[Prompt]:
    """A prompts file's prompts: JSONL (`.jsonl`: `{"prompt": "..."}` or `{"prompt_ids": [...]}` a line, read line
    by line) or one text a line."""
    if not path.endswith(".jsonl"):
        for number, text in enumerate(read_text_lines(path), start=1):
            if text.strip():
                yield Prompt(number, text, None)
        return
    from ..rollouts.rollouts_file import json_lines

    for number, raw in json_lines(path, "prompts file"):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            entry = None
        if not isinstance(entry, dict):
            raise InputError(f"{path} line {number}: not a JSON object")
        given, ids = entry.get("prompt"), entry.get("prompt_ids")
        if isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids):
            yield Prompt(number, None, ids)
        elif isinstance(given, str) and given.strip():
            yield Prompt(number, given, None)
        else:
            raise InputError(f"{path} line {number}: no prompt (a non-empty string) nor prompt_ids (token ids)")


def save_rollouts(
    endpoint: Endpoint,
    prompts: Iterator[Prompt],
    path: str,
    max_new_tokens: int,
    sampling: Sampling,
    seed: int,
    samples: int,
    progress: Callable[[int], None] | None = None,
    concurrency: int = 1,
) -> int:
    """Every prompt's `samples` rollouts written to `path` (a new file, made once its first line is ready: a fault
    before it leaves none behind) in the prompts' order, `concurrency` requests in flight; how many."""

    def sample(job: tuple[Prompt, int]):
        prompt, sample_seed = job
        return endpoint.complete(
            prompt.sent,
            max_new_tokens,
            top_logprobs=1,
            token_ids=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sample_seed,
            tokens_as_ids=True,
        )

    jobs = ((prompt, seed + index * samples + k) for index, prompt in enumerate(prompts) for k in range(samples))
    fd: int | None = None
    written = 0
    try:
        for (prompt, sample_seed), served in in_order(sample, jobs, concurrency):
            line = _rollout_line(served, prompt, sample_seed, endpoint.url) | sampling.as_json()
            data = (json.dumps(line) + "\n").encode()
            if fd is None:
                fd = _new_file(path)
            done = os.write(fd, data)
            while done < len(data):
                done += os.write(fd, data[done:])
            written += 1
            if progress is not None:
                progress(written)
    finally:
        if fd is not None:
            os.close(fd)
    return written


def in_order(call: Callable[[Any], Any], jobs: Iterator, concurrency: int) -> Iterator[tuple[Any, Any]]:
    """(job, call(job)) for each job in the jobs' order, with up to `concurrency` calls running at once (daemon
    threads: Ctrl+C or a fault ends the command at once, never waiting on a request in flight). A call's fault is
    raised at its turn, after every answer before it; so is a fault of the jobs' own iterator (a bad prompts line)."""
    pending: collections.deque = collections.deque()
    stopped: list[BaseException] = []

    def start_next() -> None:
        if stopped:
            return
        try:
            job = next(jobs)
        except StopIteration:
            return
        except Exception as fault:  # noqa: BLE001 - raised once the calls before it are answered
            stopped.append(fault)
            return
        box: queue.SimpleQueue = queue.SimpleQueue()

        def run() -> None:
            try:
                box.put((call(job), None))
            except Exception as fault:  # noqa: BLE001 - handed to the caller's thread, which raises it
                box.put((None, fault))

        threading.Thread(target=run, name="batchtui-sample", daemon=True).start()
        pending.append((job, box))

    for _ in range(concurrency):
        start_next()
    while pending:
        job, box = pending.popleft()
        answer, fault = box.get()
        if fault is not None:
            raise fault
        yield job, answer
        start_next()
    if stopped:
        raise stopped[0]


def _rollout_line(served, prompt: Prompt, seed: int, url: str) -> dict:
    where = f"{url}: the completion of prompt line {prompt.line}"
    if served.prompt_token_ids is None or served.token_ids is None or served.steps is None:
        raise EndpointError(f"{where} has no token ids or logprobs (vLLM's return_token_ids): rollouts need both")
    ids, steps = list(served.token_ids), served.steps
    if not ids or len(steps) != len(ids):
        raise EndpointError(f"{where}: {len(ids)} token ids for {len(steps)} logprobs")
    outside = next((i for i in (*served.prompt_token_ids, *ids) if not 0 <= i < _MAX_VOCABULARY), None)
    if outside is not None:
        raise EndpointError(f"{where}: token id {str(outside)[:24]} is outside any vocabulary")
    logprobs, top1 = [], []
    for step, (token, s) in enumerate(zip(ids, steps)):
        if s.logprob is None or not math.isfinite(s.logprob) or s.logprob > 0:
            raise EndpointError(f"{where}: step {step}'s logprob is {s.logprob}, not a logprob")
        if s.token != f"{_TOKEN_ID}{token}":
            raise EndpointError(f"{where}: step {step} names token {s.token!r}, its id is {token}")
        logprobs.append(s.logprob)
        top1.append(_id(s.top[0][0], f"{where}: step {step}'s top-1") if s.top else None)
    line = {"prompt_ids": list(served.prompt_token_ids), "completion_ids": ids, "logprobs": logprobs}
    if all(t is not None for t in top1):
        line["top1_ids"] = top1
    return {
        **line,
        **({"prompt": prompt.text} if prompt.text is not None else {}),
        "seed": seed,
        "prompt_line": prompt.line,
    }


def _new_file(path: str) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    except FileExistsError:
        raise InputError(f"{path} exists: rollouts are written to a new file") from None
    except OSError as exc:
        raise InputError(f"cannot write rollouts to {path}: {exc.strerror or exc}") from None


def _id(token: str, where: str) -> int | None:
    """The id a `token_id:N` key names; None for a key of another form (a server that does not name ids); an
    EndpointError for one that names no id this tool reads (`token_id:²`, `token_id:٣`, thousands of digits)."""
    if not token.startswith(_TOKEN_ID):
        return None
    digits = token[len(_TOKEN_ID) :]
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 10 and int(digits) < _MAX_VOCABULARY):
        raise EndpointError(f"{where} is {literal(token, 40)!r}: not a token id")
    return int(digits)
