"""`batchtui endpoint` against a real OpenAI-compatible server (`transformers serve` on the built-in English model,
continuous batching, CPU), and the faults a real server can be made to produce (killed mid-run, a wrong model
name, nothing listening) or that only a raw socket produces (garbage, half an answer, silence)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from servers import http_json, raw_socket_server, stop, transformers_serve

from batchtui.core.builtin_models import builtin_path
from batchtui.core.cli import main
from batchtui.core.endpoint_client import Endpoint, EndpointError, base_url
from batchtui.core.endpoint_run import NO_LOGPROBS, NO_PROMPT_LOGPROBS, measure_endpoint

pytestmark = pytest.mark.xdist_group("endpoint")  # one worker starts the server once for the module

TEXTS = [
    "The list of objects is",
    "Return a bool indicating whether",
    "def main",
    "The default value",
    "If the file",
    "This module provides",
    "Raise an error if",
    "The number of bytes",
]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def english():
    return builtin_path("qwen2-english-4m")


@pytest.fixture(scope="module")
def server(english, tmp_path_factory):
    with transformers_serve(english, tmp_path_factory.mktemp("serve") / "serve.log") as running:
        yield running


@pytest.fixture
def served(server):
    return server[0]


def _local_greedy(model_path, texts: list[str], new_tokens: int) -> list[str]:
    """Each text alone through transformers' generate, greedy: what the server should give alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")
            new = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False)[0, ids["input_ids"].shape[1] :]
            out.append(tokenizer.decode(new, skip_special_tokens=True))
    return out


def test_alone_the_server_says_what_transformers_says_locally(served, english):
    endpoint = Endpoint(served)
    assert endpoint.resolve_model() == str(english)  # the only model it serves, found by asking
    served_texts = [endpoint.complete(text, NEW_TOKENS).text for text in TEXTS]
    assert served_texts == _local_greedy(english, TEXTS, NEW_TOKENS)
    assert all(served_texts)


def test_endpoint_command_compares_alone_and_under_load_without_logprobs(served, tmp_path, capsys):
    report = tmp_path / "endpoint.json"
    code = main(["endpoint", "--url", served, *TEXTS, "--max-new-tokens", "24", "--rounds", "2", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["failure"] is None and data["summary"]["measured"] == len(TEXTS)
    assert data["notes"] == [NO_LOGPROBS, NO_PROMPT_LOGPROBS] and f"note: {NO_LOGPROBS}" in out
    assert data["config"]["logprobs"] is False and data["config"]["steps_in"] == "characters"
    assert data["config"]["concurrency"] == len(TEXTS) and data["config"]["rounds"] == 2
    assert data["environment"]["identity"] == {"url": served, "model": data["config"]["model"]}
    for entry in data["texts"]:
        alone, loaded = entry["alone"]["text"], entry["under_load"]["text"]
        assert entry["differs"] == (alone != loaded) or entry["under_load_round"] > 0
        if entry["differs"]:  # the split is the first character where the two continuations part
            step = entry["split_step"]
            assert alone[:step] == loaded[:step] and alone[step : step + 1] != loaded[step : step + 1]
        noise = entry["alone_vs_alone"]
        assert noise["differs"] == (alone != entry["alone_again"]["text"])
        assert len(entry["rounds"]) == 2
    s = data["summary"]
    assert s["differ"] == sum(e["differs"] for e in data["texts"])
    expected = 1 if s["differ"] or s["alone_differ"] else 0
    assert code == expected
    assert f"{s['differ']} of {len(TEXTS)} continuations differ under load" in out


def test_the_api_key_is_sent_from_its_variable_and_never_shown(served, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SERVED_KEY", "sk-do-not-print-42")
    report = tmp_path / "r.json"
    code = main(["endpoint", "--url", served, "a", "--max-new-tokens", "2", "--rounds", "1", "--api-key-env",
                 "SERVED_KEY", "--json", str(report)])  # fmt: skip
    seen = capsys.readouterr()
    assert code in (0, 1)
    assert "sk-do-not-print-42" not in seen.out + seen.err + report.read_text()
    monkeypatch.delenv("SERVED_KEY")
    assert main(["endpoint", "--url", served, "a", "--api-key-env", "SERVED_KEY"]) == 2
    assert capsys.readouterr().err.strip() == (
        "batchtui: error: environment variable SERVED_KEY (--api-key-env) is not set"
    )


def test_a_wrong_model_name_is_one_line_naming_what_is_served(served, english, capsys):
    assert main(["endpoint", "--url", served, "--model", "no-such-model", "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not serve model 'no-such-model'" in err and str(english) in err


def test_nothing_listening_is_one_line_and_exit_2(capsys):
    from servers import free_port

    assert main(["endpoint", "--url", f"http://127.0.0.1:{free_port()}/v1", "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "connection refused" in err and "Traceback" not in err


GARBAGE = b"\x00\xff garbage, not HTTP \x1b[2J\r\n\r\n"
NOT_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{not json"
HALF_AN_ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{"object": "li'
MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
COMPLETION = (
    b'{"id": "x", "object": "text_completion", "created": 0, "model": "m", '
    b'"choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": null}]}'
)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (GARBAGE, "cannot connect"),
        (NOT_JSON, "not valid JSON"),
        (HALF_AN_ANSWER, "closed the connection"),
        (None, "no answer within 1 s"),
    ],
    ids=["garbage", "not-json", "truncated", "silence"],
)
def test_a_socket_that_is_no_server_is_one_line_and_exit_2(answer, words, capsys):
    with raw_socket_server(answer) as (url, received):
        code = main(["endpoint", "--url", url, "--model", "m", "a", "--timeout", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert "\x1b" not in err and "Traceback" not in err
    assert len(received) == 1 and received[0].startswith(b"GET /v1/models")  # no retry


def test_a_fault_after_the_models_list_keeps_the_report_with_the_failure(tmp_path, capsys):
    answer = http_json(MODELS)
    report = tmp_path / "r.json"
    with raw_socket_server(answer) as (url, received):
        code = main(["endpoint", "--url", url, "a", "b", "--json", str(report), "--timeout", "5"])
    err = capsys.readouterr().err
    data = json.loads(report.read_text())
    assert code == 2 and "is not a completion" in data["failure"] and data["failure"] in err
    assert [t["measured"] for t in data["texts"]] == [False, False]
    assert b'"prompt":"a"' in received[1].replace(b" ", b"")  # the text went to the URL named, once


def test_ctrl_c_under_load_ends_at_once_not_when_the_requests_in_flight_time_out():
    """The models list, the probe and both alone runs are answered; the request under load never is."""
    import signal
    import subprocess
    import sys
    import time

    posts = []

    def answer(request: bytes):
        if request.startswith(b"GET"):
            return http_json(MODELS)
        posts.append(request)
        return http_json(COMPLETION) if len(posts) <= 3 else None

    with raw_socket_server(answer) as (url, received):
        command = [sys.executable, "-m", "batchtui.core", "endpoint", "--url", url, "a", "--rounds", "1"]
        process = subprocess.Popen([*command, "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while len(posts) < 4:  # the request under load is in flight
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)  # far less than the request's 120 s
        finally:
            process.kill()
    assert process.returncode == 130 and err.decode().strip().endswith("batchtui: interrupted")


def test_a_plain_server_at_an_https_url_is_a_tls_failure(capsys):
    with raw_socket_server(NOT_JSON, first=True) as (url, _):
        code = main(["endpoint", "--url", url.replace("http://", "https://"), "--model", "m", "a", "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "TLS failure" in err, err


def test_urls_are_checked_and_the_api_root_found():
    assert base_url("http://h:8000") == base_url("http://h:8000/v1/") == "http://h:8000/v1"
    with pytest.raises(EndpointError.__mro__[1], match="http:// or https://"):
        base_url("ftp://h/v1")


def test_without_the_extra_the_command_says_how_to_install_it(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "openai", None)
    assert main(["endpoint", "--url", "http://127.0.0.1:1/v1", "a"]) == 2
    assert "pip install 'batchtui[endpoint]'" in capsys.readouterr().err


# Logprobs and prompt logprobs: answers in the exact schema of the openai package's types, with vLLM's
# `prompt_logprobs` (which `transformers serve` does not return).


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


async def test_the_app_with_url_shows_served_continuations_in_the_generation_view(served, tmp_path):
    from textual.widgets import DataTable
    from tui_helpers import settle

    from batchtui.core.settings import Settings
    from batchtui.tui.app import BatchtuiApp
    from batchtui.tui.endpoint_runs import EndpointTarget
    from batchtui.tui.generation_pane import GenerationPane
    from batchtui.tui.status_line import StatusLine

    texts = TEXTS[:4]
    app = BatchtuiApp(texts, Settings(model="tiny"), output_dir=tmp_path, endpoint=EndpointTarget(served))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        served_result = app.state.generation_on_screen
        assert served_result is not None and served_result.failure is None, app.query_one(StatusLine).full_text()
        assert app.state.comparison is None  # nothing ran locally
        pane = app.query_one(GenerationPane)
        table = pane.query_one(DataTable)
        assert table.row_count == len(texts)
        assert [str(c.label) for c in table.columns.values()] == ["#", "split", "load →", "alone →"]
        assert "continuations differ under load" in str(pane.border_title)
        for hidden in ("#heatmap", "#settings", "#summary"):
            assert not app.query_one(hidden).display
        assert app.query_one("#generation").display
        assert served in app.query_one(StatusLine).full_text()
        await pilot.press("d", "b")  # a local model's settings: nothing to change on a server
        assert app.state.settings == Settings(model="tiny") and app.state.run_number == 1
        await pilot.press("down")
        assert app.state.selected[0] == 1
        shown = str(pane.query_one("#gen-single").content)
        assert shown.startswith("alone (") and served_result.texts[1].alone.text[:8] in shown
        assert app.report_on_screen()["texts"][1]["alone"]["text"] == served_result.texts[1].alone.text


def test_a_server_killed_mid_run_keeps_what_was_measured(server):
    """Last in the module: it kills the module's server rather than start another."""
    url, process = server
    endpoint = Endpoint(url, timeout_s=30)
    endpoint.resolve_model()

    class KilledAfterThreeTexts:  # the real server, killed between two requests
        texts = 0

        def complete(self, text, max_new_tokens, *args):
            if max_new_tokens > 1:  # not the capability probe
                self.texts += 1
                if self.texts == 4:
                    stop(process)
            return endpoint.complete(text, max_new_tokens, *args)

    result = measure_endpoint(KilledAfterThreeTexts(), TEXTS, max_new_tokens=4, rounds=1)
    assert result.failure is not None and "connection refused" in result.failure
    kept = [t for t in result.texts if t.alone is not None]
    assert len(kept) == 3  # three texts alone before the fourth request failed
    assert all(not t.measured and t.differs is None for t in result.texts)
    assert result.summary.measured == 0
