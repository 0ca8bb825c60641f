"""A rollouts file: one JSON object a line, each a sequence a sampler made, read streaming and checked line by line.

A line holds `prompt_ids` and `completion_ids` (lists of token ids; `prompt` and `completion` strings instead where the
model's tokenizer is at hand: the prompt tokenized as the tokenizer does by default, special tokens included, the
completion without them), `logprobs` (the sampler's logprob of each completion token) and optionally `top1_ids` (the
sampler's own top-1 token at each step, where it gave it), `mask` (one 0 or 1 a completion token: 0 for a token the
sampler did not choose, a tool's output or a turn of another speaker, scored with the rest but not counted), `step`
(the training step that sampled it) and `group` (its prompt's group, as GRPO groups a prompt's samples): the report
breaks the metrics down by each. Other keys are ignored. Blank lines are skipped.

The file is someone else's: a line is read up to `MAX_LINE_BYTES`, every field is checked for its type, ids lie in the
vocabulary, logprobs are finite and at most 0, one per completion token, and the sequence fits the model's context.
A fault is an `InputError` naming the line; `RolloutFaults` with `skip_bad` counts faulty lines instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import InputError
from ..untrusted import MiB, finite, open_regular

# A line longer than this is refused unread (a 32k-token rollout with its logprobs is about 1 MiB of JSON).
MAX_LINE_BYTES = 16 * MiB
# The faults a report lists by line (all are counted).
FAULTS_KEPT = 20
# The most distinct `step`s or `group`s a file may name: the breakdown holds a tally for each.
MAX_KEYS = 100_000
_GROUP_CHARS = 200


@dataclass(frozen=True)
class Rollout:
    """One sequence of the file: where it is, its tokens and the sampler's logprobs of the completion's."""

    line: int  # 1-based, as an editor shows it
    digest: str  # of the line's bytes: a records file is matched to its input by it
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top1_ids: tuple[int, ...] | None
    temperature: float | None = None  # what the line says it was sampled at (`endpoint --save-rollouts` writes it)
    truncation: tuple[float, int] = (1.0, 0)  # the line's top_p and top_k (1 and 0: the whole distribution)
    mask: tuple[bool, ...] | None = None  # per completion token, whether it counts (None: every one)
    step: int | None = None
    group: str | None = None


@dataclass(frozen=True)
class Vocabulary:
    """What a line is checked against: the model's vocabulary size and context, and its tokenizer where a line
    gives strings (`encode(text, special) -> ids`)."""

    size: int
    context: int
    encode: Callable[[str, bool], list[int]] | None = None


class RolloutFaults:
    """Faulty lines: raised at the first (the default), or counted and the first `FAULTS_KEPT` kept (`--skip-bad`).
    After a reading, what it checked: the last line read and the faulty lines' numbers (`read_rollouts`' `checked`)."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.count = 0
        self.kept: list[str] = []
        self.lines: set[int] = set()  # the faulty lines' numbers (few: skipped with --skip-bad, else the first ends)
        self.last_line = 0
        self.temperatures: dict[float | None, int] = {}  # each temperature the lines give, at its first line
        self.truncations: dict[tuple[float, int], int] = {}  # each (top_p, top_k) the lines give, at its first line
        self.steps: set = set()  # the distinct steps and groups the lines name (at most MAX_KEYS each)
        self.groups: set = set()

    def __call__(self, fault: InputError, number: int) -> None:
        if not self.skip_bad:
            raise fault
        self.count += 1
        self.lines.add(number)
        if len(self.kept) < FAULTS_KEPT:
            self.kept.append(str(fault))


def read_rollouts(
    path: str, vocabulary: Vocabulary, faults: RolloutFaults, checked: RolloutFaults | None = None
) -> Iterator[Rollout]:
    """The file's rollouts in order, each line checked (`faults` decides what a faulty one does). With `checked`
    (an earlier reading's faults), exactly the lines that reading took: none past its last line, not its faulty
    ones, and a line that is faulty now, or missing, ends the reading (the file changed since it was checked)."""
    number = 0
    for number, raw in json_lines(path, "rollouts file"):
        if checked is not None and number > checked.last_line:
            return
        if checked is not None and number in checked.lines:
            continue
        faults.last_line = number
        if not raw.strip():
            continue
        try:
            rollout = _rollout(number, raw, vocabulary)
        except InputError as fault:
            if checked is not None:
                raise InputError(f"{path} changed since it was checked: {fault}") from None
            faults(fault, number)
            continue
        faults.temperatures.setdefault(rollout.temperature, number)
        faults.truncations.setdefault(rollout.truncation, number)
        for key, seen, name in ((rollout.step, faults.steps, "steps"), (rollout.group, faults.groups, "groups")):
            if key is not None and key not in seen:
                if len(seen) == MAX_KEYS:
                    raise InputError(f"{path} line {number}: more than {MAX_KEYS} {name} (a breakdown a {name[:-1]})")
                seen.add(key)
        yield rollout
    if checked is not None and number < checked.last_line:
        raise InputError(f"{path} changed since it was checked: it ends at line {number}, not {checked.last_line}")


def json_lines(path: str, what: str) -> Iterator[tuple[int, bytes]]:
    """(1-based number, bytes without the line end) of each line of regular file `path` (`what` names it in a fault),
    read one at a time, none over `MAX_LINE_BYTES`."""
    with open_regular(path, what) as handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise InputError(f"{path} line {number}: longer than {MAX_LINE_BYTES // MiB} MiB")
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark an editor put first
            yield number, raw.rstrip(b"\r\n")


def line_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def _rollout(number: int, raw: bytes, vocabulary: Vocabulary) -> Rollout:
    where = f"line {number}"
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"{where}: not a JSON object") from None
    if not isinstance(entry, dict):
        raise InputError(f"{where}: not a JSON object")
    prompt = _tokens(entry, "prompt", where, vocabulary, special=True)
    completion = _tokens(entry, "completion", where, vocabulary, special=False)
    if not prompt:
        raise InputError(f"{where}: the prompt has no tokens (the first completion token needs one before it)")
    if not completion:
        raise InputError(f"{where}: the completion has no tokens")
    logprobs = _logprobs(entry.get("logprobs"), len(completion), where)
    top1 = entry.get("top1_ids")
    if top1 is not None:
        top1 = _ids(top1, "top1_ids", where, vocabulary.size)
        if len(top1) != len(completion):
            raise InputError(f"{where}: top1_ids has {len(top1)} ids, the completion {len(completion)} tokens")
    if len(prompt) + len(completion) > vocabulary.context:
        raise InputError(
            f"{where}: {len(prompt)} prompt + {len(completion)} completion tokens is more than the model's context "
            f"of {vocabulary.context} positions"
        )
    temperature = entry.get("temperature")
    if temperature is not None and not (
        type(temperature) in (int, float) and finite(temperature) and 0 < temperature <= 1000
    ):
        raise InputError(f"{where}: temperature must be a number above 0 (at most 1000), not {str(temperature)[:20]}")
    return Rollout(number, line_digest(raw), prompt, completion, logprobs, top1,
                   None if temperature is None else float(temperature), _truncation(entry, where),
                   _mask(entry.get("mask"), len(completion), where), *_step_and_group(entry, where))  # fmt: skip


def _mask(mask, n: int, where: str) -> tuple[bool, ...] | None:
    """The line's `mask`: one 0 or 1 (or false, true) a completion token; None where it gives none."""
    if mask is None:
        return None
    if not isinstance(mask, list) or not all(type(v) in (int, bool) and v in (0, 1) for v in mask):
        raise InputError(f"{where}: mask must be a list of 0 and 1 (1: the sampler chose the token, 0: not counted)")
    if len(mask) != n:
        raise InputError(f"{where}: mask has {len(mask)} values, the completion {n} tokens")
    return tuple(bool(v) for v in mask)


def _step_and_group(entry: dict, where: str) -> tuple[int | None, str | None]:
    step, group = entry.get("step"), entry.get("group")
    if step is not None and not (type(step) is int and 0 <= step <= 2**31):
        raise InputError(f"{where}: step must be a whole number from 0, not {str(step)[:20]}")
    if group is not None and not (
        (type(group) is int and abs(group) <= 2**63) or (isinstance(group, str) and len(group) <= _GROUP_CHARS)
    ):
        raise InputError(f"{where}: group must be a whole number or a string of at most {_GROUP_CHARS} characters")
    return step, None if group is None else str(group)


def _truncation(entry: dict, where: str) -> tuple[float, int]:
    """The line's (top_p, top_k): 1 and 0 where it gives none (the whole distribution)."""
    top_p, top_k = entry.get("top_p", 1.0), entry.get("top_k", 0)
    if not (type(top_p) in (int, float) and finite(top_p) and 0 < top_p <= 1):
        raise InputError(f"{where}: top_p must be a number above 0 and at most 1, not {str(top_p)[:20]}")
    if not (type(top_k) is int and 0 <= top_k <= 2**31):
        raise InputError(f"{where}: top_k must be 0 (off) or a count of tokens, not {str(top_k)[:20]}")
    return float(top_p), top_k


def _tokens(entry: dict, name: str, where: str, vocabulary: Vocabulary, special: bool) -> tuple[int, ...]:
    ids, text = entry.get(f"{name}_ids"), entry.get(name)
    if ids is not None:
        return _ids(ids, f"{name}_ids", where, vocabulary.size)
    if text is None:
        raise InputError(f"{where}: no {name}_ids (nor a {name} string)")
    if not isinstance(text, str):
        raise InputError(f"{where}: {name} must be a string")
    if vocabulary.encode is None:
        raise InputError(f"{where}: {name} is a string and the model has no tokenizer here: give {name}_ids")
    try:
        return tuple(vocabulary.encode(text, special))
    except (UnicodeEncodeError, ValueError) as exc:
        raise InputError(f"{where}: {name} cannot be tokenized ({type(exc).__name__})") from None


# (exact types, as JSON gives them: true and false are not numbers; a file's thousands of lines are checked twice)
def _ids(value: object, name: str, where: str, size: int) -> tuple[int, ...]:
    if type(value) is not list or not all(type(i) is int for i in value):
        raise InputError(f"{where}: {name} must be a list of whole numbers")
    if value and (min(value) < 0 or max(value) >= size):
        outside = next(i for i in value if not 0 <= i < size)
        raise InputError(f"{where}: {name} holds {outside}, outside the model's vocabulary of {size}")
    return tuple(value)


def _logprobs(value: object, tokens: int, where: str) -> tuple[float, ...]:
    if value is None:
        raise InputError(f"{where}: no logprobs (the sampler's logprob of each completion token)")
    if type(value) is not list or not all(type(v) is float or type(v) is int for v in value):
        raise InputError(f"{where}: logprobs must be a list of numbers")
    if len(value) != tokens:
        raise InputError(f"{where}: logprobs has {len(value)} values, the completion {tokens} tokens")
    if not all(map(finite, value)) or (value and max(value) > 0):
        step, v = next((step, v) for step, v in enumerate(value) if not finite(v) or v > 0)
        shown = f"{str(v)[:12]}... ({len(str(v))} digits)" if isinstance(v, int) else str(v)
        raise InputError(f"{where}: logprob {step} is {shown}: a logprob is a finite number at most 0")
    return tuple(map(float, value))
