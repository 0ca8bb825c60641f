"""Logprobs and prompt logprobs, which `transformers serve` does not return: answers in the exact schema of the
openai package's types, with vLLM's `prompt_logprobs`."""

from __future__ import annotations

import math

import pytest

from batchtui.core.endpoint_run import NO_PROMPT_LOGPROBS, measure_endpoint


def _choice(text: str, tokens: list[str], logprobs: list[float], tops: list[dict], prompt=None):
    from openai.types import Completion

    choice = {"index": 0, "finish_reason": "length", "text": text,
              "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
                           "text_offset": list(range(len(tokens)))}}  # fmt: skip
    if prompt is not None:
        choice["prompt_logprobs"] = prompt
    answer = {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    return Completion.model_validate(answer).choices[0]


def test_logprobs_give_token_steps_the_split_its_margin_and_near_tie():
    from batchtui.core.endpoint_client import continuation_from
    from batchtui.core.endpoint_result import split_of

    alone = continuation_from(_choice(" a b", [" a", " b"], [-0.5, -0.70],
                                      [{" a": -0.5, " c": -2.0}, {" b": -0.70, " d": -0.71}]))  # fmt: skip
    loaded = continuation_from(_choice(" a d", [" a", " d"], [-0.52, -0.69],
                                       [{" a": -0.52, " c": -1.9}, {" d": -0.69, " b": -0.72}]))  # fmt: skip
    split = split_of(alone, loaded)
    assert split.step == 1
    assert split.logprob_diffs == pytest.approx((-0.02, -0.02))  # the alone run's token in both runs
    assert split.margin == pytest.approx(0.01) and split.near_tie is True
    assert split.reference_top == ((" b", -0.70), (" d", -0.71)) and split.other_top[0] == (" d", -0.69)
    same = split_of(alone, alone)
    assert same.step is None and same.max_abs_diff == 0 and same.near_tie is None


def test_prompt_logprobs_compare_each_prompt_position():
    from batchtui.core.endpoint_client import continuation_from
    from batchtui.core.endpoint_result import prompt_comparison

    def prompt(second: float, third_top: str):
        return [None, {"11": {"logprob": second, "rank": 1, "decoded_token": " x"},
                       "12": {"logprob": -3.0, "rank": 2, "decoded_token": " y"}},
                {"13": {"logprob": -0.1, "rank": 1, "decoded_token": third_top}}]  # fmt: skip

    a = continuation_from(_choice(" a", [" a"], [-0.5], [{" a": -0.5}], prompt(-1.0, " z")))
    b = continuation_from(_choice(" a", [" a"], [-0.5], [{" a": -0.5}], prompt(-1.25, " w")))
    compared = prompt_comparison(a, b)
    assert math.isnan(compared.max_abs_diff[0]) and compared.max_abs_diff[1] == pytest.approx(0.25)
    assert compared.top1_flip == (False, False, True) and compared.max == pytest.approx(0.25)


def test_measure_endpoint_reports_logprob_splits_in_the_json():
    """The whole path with logprobs: a completer whose second answer under load changes a near-tie."""
    from batchtui.core.endpoint_client import continuation_from
    from batchtui.core.endpoint_report import endpoint_json

    steady = continuation_from(_choice(" a b", [" a", " b"], [-0.5, -0.70],
                                       [{" a": -0.5, " c": -2.0}, {" b": -0.70, " d": -0.71}]))  # fmt: skip
    moved = continuation_from(_choice(" a d", [" a", " d"], [-0.5, -0.69],
                                      [{" a": -0.5, " c": -2.0}, {" d": -0.69, " b": -0.72}]))  # fmt: skip

    class Answers:
        calls = 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0):
            self.calls += 1
            return moved if self.calls == 4 else steady  # probe, alone, alone again, then under load

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=2, rounds=2, top_logprobs=2)
    entry = endpoint_json(result)["texts"][0]
    assert result.config["steps_in"] == "tokens" and result.notes == (NO_PROMPT_LOGPROBS,)
    assert entry["differs"] is True and entry["split_step"] == 1 and entry["under_load_round"] == 0
    assert entry["under_load"]["tokens"] == [" a", " d"] and entry["alone"]["text"] == " a b"
    assert entry["split"]["near_tie"] is True and entry["split"]["top_alone"][0] == [" b", -0.70]
    assert entry["alone_vs_alone"]["differs"] is False and [r["differs"] for r in entry["rounds"]] == [True, False]
