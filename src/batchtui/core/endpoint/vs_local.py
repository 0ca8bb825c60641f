"""The served continuation through a local model: the sampler's logprobs against the trainer's (RL's
training-inference mismatch).

Each text's served token ids, prompt and continuation, go through the local transformers model in one forward
pass; at each continuation step the local logprob of the served token is set against the served one. The ratio
exp(local - served) is RL's importance ratio on that token: 1 where trainer and sampler agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..numbers.importance import importance_ratio, logprob_move
from ..one_run import one_run_at_a_time
from ..run.backend import ServedContinuation
from ..settings import Settings
from ..visible import literal


@dataclass(frozen=True)
class ServedVsLocal:
    served: tuple[float, ...]  # the served logprob of each continuation token
    local: tuple[float, ...]  # the local model's logprob of the same token, after the same prefix
    local_top1_differs: tuple[bool, ...]  # the local model's most likely token is not the served one

    @property
    def steps(self) -> int:
        return len(self.served)

    @property
    def diffs(self) -> tuple[float, ...]:
        return tuple(logprob_move(se, lo) for lo, se in zip(self.local, self.served))

    @property
    def max_abs_diff(self) -> float:
        return max((abs(d) for d in self.diffs), default=0.0)

    @property
    def mean_abs_diff(self) -> float:
        return sum(abs(d) for d in self.diffs) / len(self.diffs) if self.diffs else 0.0

    @property
    def top1_disagree(self) -> int:
        return sum(self.local_top1_differs)

    @property
    def ratio_min(self) -> float:
        return min((importance_ratio(d) for d in self.diffs), default=1.0)

    @property
    def ratio_max(self) -> float:
        return max((importance_ratio(d) for d in self.diffs), default=1.0)


@one_run_at_a_time()
def served_vs_local(
    texts: list[str],
    lines: list[int],
    served: list[ServedContinuation | None],
    settings: Settings,
    max_new_tokens: int,
) -> list[ServedVsLocal | None]:
    """Per text, the served continuation (with its token ids and logprobs) through the local model of `settings`
    (in the batch-invariant mode with `settings.invariant`); None where the server gave no ids or logprobs.
    InputError when the local tokenizer makes other ids of a prompt than the server did: another tokenizer; and when
    the server's ids do not fit its own answer (more or fewer than its logprobs, more than `max_new_tokens`, outside
    the local vocabulary): the server is not trusted to set the local work."""
    import torch

    from ..invariant.mode import invariant_if
    from ..models.loading import load_model

    loaded = load_model(settings)
    model, tokenizer = loaded.model, loaded.tokenizer
    results: list[ServedVsLocal | None] = []
    for text, line, answer in zip(texts, lines, served):
        if answer is None or answer.token_ids is None or answer.prompt_token_ids is None or answer.steps is None:
            results.append(None)
            continue
        if list(tokenizer(text)["input_ids"]) != list(answer.prompt_token_ids):
            raise InputError(
                f"text {line}: the local model {literal(settings.model, 60)} tokenizes it otherwise than the server "
                "does: another tokenizer, so its logprobs cannot be set against the served ones"
            )
        prompt, continuation = list(answer.prompt_token_ids), list(answer.token_ids)
        _check_ids(line, continuation, len(answer.steps), max_new_tokens, prompt, loaded.vocab_size)
        ids = torch.tensor([prompt + continuation], device=loaded.device)
        with torch.inference_mode(), invariant_if(settings.invariant, model):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
        # The logits at position p predict the token at p + 1: the continuation's come from the last prompt position.
        steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(continuation)].float().log_softmax(dim=-1)
        chosen = torch.tensor(continuation, device=steps.device)
        local = steps.gather(1, chosen[:, None])[:, 0].tolist()
        differs = (steps.argmax(dim=-1) != chosen).tolist()
        logprobs = [s.logprob for s in answer.steps if s.logprob is not None]
        if len(logprobs) < len(answer.steps):
            results.append(None)
            continue
        results.append(ServedVsLocal(tuple(logprobs), tuple(local), tuple(differs)))
    return results


def _check_ids(line: int, continuation: list[int], steps: int, max_new_tokens: int, prompt: list[int], vocab: int):
    where = f"the server's answer for text {line}"
    if len(continuation) != steps or len(continuation) > max_new_tokens:
        raise InputError(
            f"{where}: {len(continuation)} continuation token ids for {steps} logprobs (at most {max_new_tokens} "
            "new tokens were asked): not compared with the local model"
        )
    outside = next((i for i in (*prompt, *continuation) if not 0 <= i < vocab), None)
    if outside is not None:
        raise InputError(f"{where}: token id {outside} is outside the local model's vocabulary of {vocab}")
