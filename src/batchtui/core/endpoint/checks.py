"""Two checks on a served model beside the concurrency ladder, each from requests of its own.

- Prefill vs decode: the continuation's logprobs as decoded step by step (a KV cache) against the prompt logprobs
  of prompt + continuation sent as one prompt (a prefill), token by token, aligned by token id.
- Prefix cache, hit vs miss: a long prefix (made unique, so that the first request cannot hit) and the text, sent
  twice; the second may reuse the first's cached prefix. The continuations' tokens and logprobs are compared; the
  server's count of cached prompt tokens says whether it did (where it reports it).
"""

from __future__ import annotations

import secrets

from ..numbers.importance import logprob_move
from ..run.backend import Completer, ServedContinuation
from .result import PrefillDecode, PrefixCacheCheck, split_of

NO_PREFILL = (
    "this server returns no token ids or prompt logprobs (vLLM's return_token_ids, prompt_logprobs): prefill vs "
    "decode not compared"
)
CACHE_UNKNOWN = (
    "the server does not say how many prompt tokens its prefix cache gave (vLLM: --enable-prompt-tokens-details): "
    "whether the second request hit is unknown"
)
# The shared part of the prefix-cache prompts: about 300 tokens of English for the built-in model, so that it fills
# whole cache blocks (vLLM's CPU build caches in blocks of 128 tokens) and still leaves room in a small context.
SHARED_PREFIX = (
    "The following notes describe the behaviour of the functions in this module. Each function takes its "
    "arguments by keyword, returns a new object rather than changing the one it was given, and raises an error "
    "when an argument has the wrong type or value. The examples below assume that the module has been imported "
    "and that the default settings are in effect. Where a function reads a file, the file is opened in text mode "
    "with the encoding given by the locale, and it is closed again before the function returns.\n\n"
    "A value that is not given takes its default, which is listed with each function. Most defaults are chosen so "
    "that a call with no arguments does something useful; where that is not possible, the argument is required "
    "and a call without it raises a TypeError. Numbers may be given as integers or as floating point values, and "
    "strings are compared as they are, without any change of case. A list that is returned is always a new list, "
    "so that changing it does not change the state of the module.\n\n"
    "Errors are reported by raising exceptions. A function that cannot complete its work leaves everything as it "
    "was before the call, so that the caller may try again. The messages of the exceptions name the argument that "
    "was wrong and say what was expected instead. Warnings are issued for uses that still work but may stop "
    "working in a later version; they can be turned into errors with the options of the warnings module.\n\n"
)


class NotCompared(Exception):
    """The server answered a check's request, but with too little to compare: the message says what lacked."""


def prefill_vs_decode(completer: Completer, alone: ServedContinuation) -> PrefillDecode | None:
    """None where the continuation lacks what it takes (token ids and logprobs); NotCompared where the prefill's
    prompt logprobs are fewer than its tokens or lack one of the continuation's."""
    if alone.token_ids is None or alone.prompt_token_ids is None or alone.steps is None:
        return None
    prompt = list(alone.prompt_token_ids)
    prefill = completer.complete(prompt + list(alone.token_ids), 1, 0, 1, True)
    positions = prefill.prompt_by_id
    sent = len(prompt) + len(alone.token_ids)
    if positions is None or len(positions) < sent:
        raise NotCompared(
            f"the server's prompt logprobs cover {0 if positions is None else len(positions)} of the {sent} prompt "
            "tokens sent"
        )
    diffs = []
    for step, (token, decoded) in enumerate(zip(alone.token_ids, alone.steps)):
        listed = positions[len(prompt) + step] or {}
        if decoded.logprob is None:
            return None
        if token not in listed:
            raise NotCompared(f"the server's prompt logprobs lack continuation token {step} (id {token})")
        diffs.append(logprob_move(decoded.logprob, listed[token]))
    return PrefillDecode(tuple(diffs))


def prefix_cache(completer: Completer, text: str, max_new_tokens: int, top_logprobs: int) -> PrefixCacheCheck:
    """`text` behind a long prefix that no earlier request had (a random note first), sent cold, then again."""
    prompt = f"Note {secrets.token_hex(4)}. {SHARED_PREFIX}{text}"
    cold = completer.complete(prompt, max_new_tokens, top_logprobs, 0, False)
    warm = completer.complete(prompt, max_new_tokens, top_logprobs, 0, False)
    return PrefixCacheCheck(warm.cached_tokens, split_of(cold, warm))
