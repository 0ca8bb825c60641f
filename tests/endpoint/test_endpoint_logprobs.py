"""Logprobs and prompt logprobs, which `transformers serve` does not return: answers in the exact schema of the
openai package's types, with vLLM's `prompt_logprobs`."""

from __future__ import annotations

import math

import pytest

from batchtui.core.endpoint.checks import CACHE_UNKNOWN, NO_PREFILL
from batchtui.core.endpoint.run import NO_PROMPT_LOGPROBS, measure_endpoint


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
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.result import split_of

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
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.result import prompt_comparison

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
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import endpoint_json

    steady = continuation_from(_choice(" a b", [" a", " b"], [-0.5, -0.70],
                                       [{" a": -0.5, " c": -2.0}, {" b": -0.70, " d": -0.71, " e": -2.0}]))  # fmt: skip
    # a margin of 0.01 swapped where a third token moved by 0.02: within what moved otherwise, a near-tie
    moved = continuation_from(_choice(" a d", [" a", " d"], [-0.5, -0.69],
                                      [{" a": -0.5, " c": -2.0}, {" d": -0.69, " b": -0.72, " e": -2.02}]))  # fmt: skip

    class Answers:
        calls = 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            self.calls += 1
            return moved if self.calls == 5 else steady  # probe, alone, alone again (twice: 2 rounds), under load

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=2, concurrency=1, rounds=2, top_logprobs=2)
    entry = endpoint_json(result)["texts"][0]
    assert result.config["steps_in"] == "tokens" and result.notes == (NO_PROMPT_LOGPROBS, NO_PREFILL, CACHE_UNKNOWN)
    assert entry["differs"] is True and entry["split_step"] == 1 and entry["under_load_round"] == 0
    assert entry["under_load"]["tokens"] == [" a", " d"] and entry["alone"]["text"] == " a b"
    assert entry["split"]["near_tie"] is True and entry["split"]["top_alone"][0] == [" b", -0.70]
    assert entry["alone_vs_alone"]["differs"] is False and [r["differs"] for r in entry["rounds"]] == [True, False]


def test_the_ladder_says_per_level_what_splits_what_keeps_its_tokens_and_where_it_first_breaks():
    """Two texts, one round per level: from the level of 4 on, the same tokens come back with a logprob moved by
    2**-10; at 8 the second step's token changes. The calls are counted, so each level's answers are known."""
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import endpoint_json, endpoint_verdict, format_endpoint_table

    def answer(first: float, second: str):
        return continuation_from(_choice(" a" + second, [" a", second], [first, -0.70],
                                         [{" a": first, " c": -2.0}, {second: -0.70, " d": -0.71}]))  # fmt: skip

    steady, moved, split = answer(-0.5, " b"), answer(-0.5 + 2**-10, " b"), answer(-0.5, " d")

    class Answers:
        calls = 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            self.calls += 1  # 1 probe, 4 alone; levels 1 and 2: 2 calls each; 4: 4 calls; 8: 8 calls
            return steady if self.calls <= 9 else moved if self.calls <= 13 else split

    result = measure_endpoint(Answers(), ["t", "u"], max_new_tokens=2, concurrency=[1, 2, 4, 8], rounds=1,
                              top_logprobs=2)  # fmt: skip
    levels = endpoint_json(result)["levels"]
    assert [(lv["concurrency"], lv["texts_split"], lv["texts_logprobs_differ"]) for lv in levels] == [
        (1, 0, 0), (2, 0, 0), (4, 0, 2), (8, 2, 0)
    ]  # fmt: skip
    assert levels[2]["max_abs_logprob_diff"] == 2**-10 and levels[0]["max_abs_logprob_diff"] == 0
    assert result.first_breaking_concurrency == 4 and endpoint_json(result)["first_breaking_concurrency"] == 4
    assert "first breaks at concurrency 4" in endpoint_verdict(result)
    assert "split 1" in format_endpoint_table(result)  # over all levels, the split is the outcome shown

    class LogprobsOnly(Answers):
        def complete(self, *args, **kwargs):
            self.calls += 1
            return steady if self.calls <= 7 else moved

    same_tokens = measure_endpoint(LogprobsOnly(), ["t", "u"], max_new_tokens=2, concurrency=[1, 2], rounds=1,
                                   top_logprobs=2)  # fmt: skip
    assert same_tokens.first_breaking_concurrency == 2 and same_tokens.any_differs
    assert "Δlp 9.77e-04" in format_endpoint_table(same_tokens)
    assert "0 of 2 continuations differ under load" in endpoint_verdict(same_tokens)
    assert "2 more keep their tokens with logprobs apart by up to 9.77e-04" in endpoint_verdict(same_tokens)
    from batchtui.tui.views.served import endpoint_screen

    screen = endpoint_screen(same_tokens)  # the app's view says the same
    assert [row.split_cell for row in screen.rows] == ["Δlp 9.77e-04"] * 2
    assert screen.ladder.logprobs_differ == (0, 2) and screen.ladder.split == (0, 0)
    assert screen.ladder.caption.startswith("concurrency ladder, 1 round a level: first breaks at 2")


def test_a_check_the_server_refuses_is_a_note_and_the_run_stands():
    """A prompt past the server's context (HTTP 400) in the prefix-cache check: noted, the ladder's results kept."""
    from batchtui.core.endpoint.client import EndpointError, continuation_from

    steady = continuation_from(_choice(" a", [" a"], [-0.5], [{" a": -0.5}]))

    class TooShortAContext:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            if isinstance(text, str) and text.startswith("Note "):
                raise EndpointError("server answered HTTP 400: this model's maximum context length is 64", 400)
            return steady

    result = measure_endpoint(TooShortAContext(), ["t", "u"], max_new_tokens=1, concurrency=[1, 2], rounds=1,
                              top_logprobs=1)  # fmt: skip
    assert result.failure is None and result.summary.measured == 2 and not result.any_differs
    refused = [n for n in result.notes if n.startswith("the server refused a request of the prefix cache")]
    assert len(refused) == 1 and "maximum context length" in refused[0]
    assert all(t.prefix_cache is None for t in result.texts)


def test_the_prefix_cache_line_says_splits_and_logprob_moves_apart():
    """Three texts behind the cache's long prefix, the warm answer of the first split, of the second the same tokens
    with a logprob moved, of the third the same: "1 split, 1 more keeps its tokens", never "2 differ". The check's
    requests ask for no prompt logprobs, so that a vLLM can answer the second from its cache."""
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import served_checks_lines

    def answer(second: str, first: float = -0.5):
        return continuation_from(_choice(" a" + second, [" a", second], [first, -0.70],
                                         [{" a": first, " c": -2.0}, {second: -0.70, " d": -0.71}]))  # fmt: skip

    steady = answer(" b")
    warm = {"split": answer(" d"), "moved": answer(" b", -0.5 + 2**-8), "same": steady}

    class Answers:
        seen: dict = {}

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            if not text.startswith("Note "):
                return steady
            assert prompt_logprobs == 0  # vLLM skips its prefix cache for a request asking for prompt logprobs
            self.seen[text] = self.seen.get(text, 0) + 1
            return steady if self.seen[text] == 1 else warm[text.rsplit(" ", 1)[-1]]  # cold, then warm

    result = measure_endpoint(Answers(), ["x split", "x moved", "x same"], max_new_tokens=2, concurrency=1, rounds=1,
                              top_logprobs=2)  # fmt: skip
    line = next(line for line in served_checks_lines(result) if line.startswith("prefix cache"))
    assert line.endswith("1 of 3 continuations split, 1 more keep their tokens with logprobs apart by up to 0.00391"), (
        line
    )


def test_a_split_s_own_swap_is_neither_a_logprob_move_nor_a_near_tie():
    """A swap of a 0.177 margin where the tokens both chose moved by 0.02 at most: the level's and the text's
    max|Δlp| are 0.02 (the split step's Δ holds the swap), and it is no near-tie (0.177 > 2 x 0.02)."""
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import endpoint_json

    alone = continuation_from(_choice(" a b", [" a", " b"], [-0.5, -0.40],
                                      [{" a": -0.5, " c": -2.0}, {" b": -0.40, " d": -0.577, " e": -3.0}]))  # fmt: skip
    tops = [{" a": -0.52, " c": -2.01}, {" d": -0.35, " b": -0.90, " e": -3.01}]
    loaded = continuation_from(_choice(" a d", [" a", " d"], [-0.52, -0.35], tops))

    class Answers:
        calls = 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            self.calls += 1
            return alone if self.calls <= 3 else loaded  # the probe, alone, alone again (the two kept); then under load

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=2, concurrency=1, rounds=1, top_logprobs=3)
    data = endpoint_json(result)
    entry = data["texts"][0]
    assert entry["split_step"] == 1 and entry["split"]["margin"] == pytest.approx(0.177)
    assert entry["split"]["logprob_diffs"] == pytest.approx([-0.02, -0.5])  # the swap's own Δ kept, step by step
    assert entry["max_abs_diff"] == pytest.approx(0.02) and entry["split"]["max_abs_diff"] == pytest.approx(0.02)
    assert data["levels"][0]["max_abs_logprob_diff"] == pytest.approx(0.02)
    assert entry["near_tie"] is False and entry["split"]["near_tie"] is False


def _served(ids, logprobs, prompt_ids=(97, 98)):
    from batchtui.core.run.backend import ServedContinuation, ServedStep

    steps = tuple(ServedStep(f"t{i}", lp, ()) for i, lp in zip(ids, logprobs))
    return ServedContinuation("x", "length", steps, None, tuple(prompt_ids), tuple(ids))


@pytest.mark.parametrize(
    ("ids", "logprobs", "said"),
    [
        (list(range(40_004)), [-1.0] * 4, "40004 continuation token ids for 4 logprobs"),
        ([99] * 3, [-1.0] * 3, "3 continuation token ids for 3 logprobs (at most 2 new tokens were asked)"),
        ([10**9, 99], [-1.0, -1.0], "token id 1000000000 is outside the local model's vocabulary of 512"),
        ([-5, 99], [-1.0, -1.0], "token id -5 is outside the local model's vocabulary"),
    ],
    ids=["ids-past-the-steps", "past-max-new-tokens", "id-too-large", "id-negative"],
)
def test_the_server_s_ids_do_not_set_the_local_work(ids, logprobs, said):
    from batchtui.core.endpoint.vs_local import served_vs_local
    from batchtui.core.errors import InputError
    from batchtui.core.settings import Settings

    with pytest.raises(InputError, match=said.replace("(", r"\(").replace(")", r"\)")):
        served_vs_local(["ab"], [1], [_served(ids, logprobs)], Settings(model="tiny", dtype="float32"), 2)


def test_a_check_with_nothing_compared_says_so():
    """A server whose continuations hold no token (`token_ids: []`): the local check compared nothing and says so,
    never "max|Δlp| 0 ... ratio 1..1"."""
    from batchtui.core.endpoint.report import served_checks_lines
    from batchtui.core.settings import Settings

    class Empty:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            return _served([], [], prompt_ids=[116])  # "t" in the tiny model's byte tokens

    result = measure_endpoint(Empty(), ["t"], max_new_tokens=2, concurrency=1, rounds=1, top_logprobs=2,
                              local=Settings(model="tiny", dtype="float32"))  # fmt: skip
    assert result.texts[0].served_vs_local.steps == 0
    assert "served vs local: nothing compared (the server's continuations hold no token)" in served_checks_lines(result)


def test_a_cache_count_past_any_prompt_is_not_believed():
    from types import SimpleNamespace

    from batchtui.core.endpoint.client import _cached_tokens

    def usage(cached, prompt=300):
        return SimpleNamespace(prompt_tokens=prompt, prompt_tokens_details=SimpleNamespace(cached_tokens=cached))

    assert _cached_tokens(usage(256)) == 256
    assert _cached_tokens(usage(10**30)) is None and _cached_tokens(usage(301)) is None
    assert _cached_tokens(usage(-1)) is None and _cached_tokens(usage(True)) is None


def test_an_answer_s_top_logprobs_are_kept_to_what_was_asked():
    """A server sending 100,000 alternatives a step (and at a prompt position) for a top-5 request: the continuation
    keeps the 6 most likely (5 and the chosen token), in order."""
    from batchtui.core.endpoint.client import continuation_from

    many = {f" t{i}": -1.0 - i / 1000 for i in range(100_000)}
    choice = _choice(" t0", [" t0"], [-1.0], [many], prompt=[None, {str(i): -1.0 - i for i in range(100_000)}])
    kept = continuation_from(choice, keep=6)
    assert [t for t, _ in kept.steps[0].top] == [f" t{i}" for i in range(6)]
    assert len(kept.prompt[1]) == 6 and sorted(kept.prompt_by_id[1]) == list(range(6))


@pytest.mark.parametrize("odd", [math.nan, -math.inf], ids=["nan", "-inf"])
def test_the_same_odd_logprob_alone_twice_is_the_same_and_a_move_to_it_under_load_is_infinite(odd):
    """NaN or -inf in both alone runs: the same answer (no "2 of 2 differ"); the same only under load: a move of
    infinite size, never hidden as Δlp 0 by max(); and a note says the server sent such values."""
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import endpoint_json

    def answer(lp):
        return continuation_from(_choice(" a b", [" a", " b"], [-0.5, lp], [{" a": -0.5}, {" b": lp}]))

    odd_alone, finite = answer(odd), answer(-0.25)

    class Answers:
        calls = 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            self.calls += 1  # the probe, alone, alone again (the two kept); then under load
            return odd_alone if self.calls <= 3 else finite

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=2, concurrency=1, rounds=1, top_logprobs=1)
    entry = endpoint_json(result)["texts"][0]
    assert entry["alone_vs_alone"]["differs"] is False and entry["differs"] is False
    assert result.texts[0].max_abs_diff == math.inf and entry["logprobs_differ"] is True
    assert entry["max_abs_diff"] is None  # JSON's null for the infinite move: the report stays JSON
    assert any(n.startswith("the server sent 2 chosen-token logprobs that are not finite") for n in result.notes)


def test_chosen_tokens_without_a_logprob_are_said():
    from batchtui.core.endpoint.client import continuation_from

    blank = continuation_from(_choice(" a", [" a"], None, [{" a": -0.5}]))

    class Answers:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            return blank

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=1, concurrency=1, rounds=1, top_logprobs=1)
    said = [n for n in result.notes if "no logprob for" in n]
    assert said == ["the server gave no logprob for 3 chosen tokens (token_logprobs null): those steps are compared "
                    "by their tokens only"]  # fmt: skip


def test_prompt_logprobs_shorter_than_the_prompt_are_said_as_such():
    """The prefill's prompt logprobs cover 2 of its 3 tokens: the note says so, not "returns no prompt logprobs"."""
    from batchtui.core.endpoint.checks import NO_PREFILL
    from batchtui.core.endpoint.run import NO_PROMPT_LOGPROBS

    class Short:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            prompt = [None, {"98": -1.0}]  # two positions, for a prefill of three tokens
            return _served_with_prompt([99], [-1.0], prompt)

    result = measure_endpoint(Short(), ["t"], max_new_tokens=1, concurrency=1, rounds=1, top_logprobs=1)
    assert NO_PROMPT_LOGPROBS not in result.notes and NO_PREFILL not in result.notes
    assert (
        "prefill vs decode: the server's prompt logprobs cover 2 of the 3 prompt tokens sent: not compared there"
        in (result.notes)
    )


def _served_with_prompt(ids, logprobs, prompt, prompt_ids=(97, 98)):
    from batchtui.core.run.backend import ServedContinuation, ServedStep

    steps = tuple(ServedStep(f"t{i}", lp, ((f"t{i}", lp),)) for i, lp in zip(ids, logprobs))
    named = tuple(None if p is None else tuple(p.items()) for p in prompt)
    by_id = tuple(None if p is None else {int(k): v for k, v in p.items()} for p in prompt)
    return ServedContinuation("x", "length", steps, named, tuple(prompt_ids), tuple(ids), by_id)


@pytest.mark.parametrize("choices", [[1], [0, 1]], ids=["index-1", "two-choices"])
def test_an_answer_that_is_not_one_choice_of_index_0_is_no_completion(choices):
    from types import SimpleNamespace

    from batchtui.core.endpoint.client import _only_choice

    with pytest.raises(ValueError, match="not one choice of index 0"):
        _only_choice([SimpleNamespace(index=i) for i in choices])
    assert _only_choice([SimpleNamespace(index=0)]).index == 0


def test_the_table_shows_what_the_server_generated_alone():
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.core.endpoint.report import format_endpoint_table

    said = continuation_from(_choice(" went home\n", [" went", " home", "\n"], [-0.5, -0.7, -0.1],
                                     [{" went": -0.5}, {" home": -0.7}, {"\n": -0.1}]))  # fmt: skip

    class Answers:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            return said

    table = format_endpoint_table(measure_endpoint(Answers(), ["She"], max_new_tokens=3, concurrency=1, rounds=1))
    header, _, row = table.splitlines()
    assert "generated alone" in header and "' went home\\n'" not in row and " went home\\n" in row


def test_the_app_s_view_counts_rounds_from_1():
    from batchtui.core.endpoint.client import continuation_from
    from batchtui.tui.views.served import endpoint_screen

    said = continuation_from(_choice(" a", [" a"], [-0.5], [{" a": -0.5}]))

    class Answers:
        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            return said

    result = measure_endpoint(Answers(), ["t"], max_new_tokens=1, concurrency=1, rounds=2, top_logprobs=1)
    assert [run.title for run in endpoint_screen(result).rows[0].runs] == ["alone (1 token)",
                                                                           "under load, round 1 (1 token)"]  # fmt: skip
