"""`endpoint --save-rollouts` against answers no real server gives (a real vLLM's are in test_vllm.py): no token ids,
a logprob above 0, a token that is not its id. Each is one line and exit 2, and the lines written before stay whole;
a rollouts file is never overwritten."""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers.servers import MODELS, http_json, scripted_server

from batchtui.core.cli import main


def _completion(ids, logprobs, tokens=None, with_ids=True) -> bytes:
    tokens = tokens or [f"token_id:{i}" for i in ids]
    choice = {
        "index": 0, "text": "x", "finish_reason": "length",
        "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                     "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)], "text_offset": [0] * len(ids)},
    }  # fmt: skip
    if with_ids:
        choice.update(prompt_token_ids=[1, 2], token_ids=ids)
    return json.dumps(
        {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    ).encode()


def _server(answers: list[bytes]):
    """/models, then each completion request answered by the next of `answers` (the last one repeated)."""
    served = [0]

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        body = answers[min(served[0], len(answers) - 1)]
        served[0] += 1
        connection.sendall(http_json(body))

    return scripted_server(script)


GOOD = _completion([5, 6], [-0.5, -1.25])


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (_completion([5, 6], [-0.5, -1.0], with_ids=False), "has no token ids or logprobs (vLLM's return_token_ids)"),
        (_completion([5, 6], [-0.5, 0.25]), "step 1's logprob is 0.25, not a logprob"),
        (_completion([5, 6], [-0.5, -1.0], tokens=["token_id:5", "token_id:9"]), "step 1 names token 'token_id:9'"),
    ],
    ids=["no-ids", "positive-logprob", "another-token"],
)
def test_a_faulty_answer_is_one_line_exit_2_and_the_lines_before_stay(bad, said, tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    with _server([GOOD, bad]) as (url, received):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "two", "--save-rollouts", str(out),
                     "--timeout", "5"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and said in err and err.count("batchtui: error") == 1 and "Traceback" not in err
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["completion_ids"] == [5, 6]
    assert json.loads(lines[0])["logprobs"] == [-0.5, -1.25] and json.loads(lines[0])["top1_ids"] == [5, 6]
    requests = [r for r in received if r.startswith(b"POST")]
    assert len(requests) == 2 and b'"return_token_ids": true' in requests[0].replace(b'":true', b'": true')


def test_top_p_and_top_k_are_sent_and_written_into_each_line(tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    with _server([GOOD]) as (url, received):
        assert main(["endpoint", "--url", url, "--model", "m", "one", "--save-rollouts", str(out),
                     "--sample-top-p", "0.9", "--sample-top-k", "5"]) == 0  # fmt: skip
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["temperature"], row["top_p"], row["top_k"]) == (1.0, 0.9, 5)
    (body,) = [json.loads(r.split(b"\r\n\r\n", 1)[1]) for r in received if r.startswith(b"POST")]
    assert (body["top_p"], body["top_k"]) == (0.9, 5)
    refused = ((["--sample-top-p", "0"], "--sample-top-p must be above 0"),
               (["--sample-top-k", "-1"], "--sample-top-k must be 0 (off)"))  # fmt: skip
    for bad, said in refused:
        assert main(["endpoint", "--url", url, "one", "--save-rollouts", str(tmp_path / "x.jsonl"), *bad]) == 2
        assert said in capsys.readouterr().err


def test_samples_get_their_own_seeds_and_an_existing_file_is_refused(tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    with _server([GOOD]) as (url, received):
        assert main(["endpoint", "--url", url, "--model", "m", "one", "two", "--save-rollouts", str(out),
                     "--samples-per-prompt", "3", "--seed", "40", "--temperature", "0.7"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == list(range(40, 46)) and [r["prompt_line"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert {r["temperature"] for r in rows} == {0.7}  # what `rollouts` scores at by default
    assert {(r["top_p"], r["top_k"]) for r in rows} == {(1.0, 0)}  # the whole distribution, said
    bodies = [json.loads(r.split(b"\r\n\r\n", 1)[1]) for r in received if r.startswith(b"POST")]
    assert [b["seed"] for b in bodies] == list(range(40, 46)) and {b["temperature"] for b in bodies} == {0.7}
    assert not any("top_p" in b or "top_k" in b for b in bodies)  # nothing asked of the server that it was not given
    assert "6 rollouts of m written to" in capsys.readouterr().out
    assert main(["endpoint", "--url", "http://127.0.0.1:9/v1", "one", "--save-rollouts", str(out)]) == 2
    assert (
        "exists: rollouts are written to a new file" in capsys.readouterr().err
        and len(out.read_text().splitlines()) == 6
    )


def test_a_served_model_s_name_reaches_the_terminal_escaped(tmp_path, capsys):
    """The one model a server lists is taken without --model, and its name is printed: never its escape codes."""
    hostile = "\x1b]0;PWNED\x07\x1b[31mm"
    models = json.dumps({"object": "list", "data": [{"id": hostile, "object": "model"}]}).encode()

    def script(connection, request, stopped):
        connection.sendall(http_json(models if request.startswith(b"GET /v1/models") else GOOD))

    out = tmp_path / "rollouts.jsonl"
    with scripted_server(script) as (url, _):
        assert main(["endpoint", "--url", url, "one", "--save-rollouts", str(out), "--timeout", "5"]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err and "\x07" not in captured.out + captured.err
    assert "1 rollouts of \\x1b]0;PWNED\\x07\\x1b[31mm written to" in captured.out, captured.out


@pytest.mark.parametrize("key", ["token_id:²", "token_id:٣", "token_id:" + "9" * 5000], ids=["superscript", "arabic",
                                                                                          "5000-digits"])  # fmt: skip
def test_a_top1_key_naming_no_id_is_one_line_exit_2_and_leaves_no_file(key, tmp_path, capsys):
    body = json.loads(_completion([5, 6], [-0.5, -1.25]))
    body["choices"][0]["logprobs"]["top_logprobs"][1] = {key: -0.1}
    out = tmp_path / "rollouts.jsonl"
    with _server([json.dumps(body).encode()]) as (url, _):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--save-rollouts", str(out), "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("batchtui: error") == 1 and "Traceback" not in err, err
    assert "step 1's top-1 is" in err and "not a token id" in err
    assert not out.exists()  # (made only once a first line is ready: a rerun is not refused)


def test_a_server_s_token_id_past_any_vocabulary_and_too_many_samples_are_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    with _server([_completion([5, 2**40], [-0.5, -1.0])]) as (url, _):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--save-rollouts", str(out), "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "is outside any vocabulary" in err and err.count("\n") == 1 and not out.exists(), err
    assert main(["endpoint", "--url", "http://127.0.0.1:9/v1", "one", "--save-rollouts", str(out),
                 "--samples-per-prompt", "100000"]) == 2  # fmt: skip
    assert "--samples-per-prompt: must be at most 1024" in capsys.readouterr().err


def test_with_concurrency_requests_overlap_and_the_lines_keep_the_prompts_order(tmp_path):
    """`--concurrency 3`: the server holds its first answer until a second request is in flight (bounded: 5 s), and
    answers the earlier seeds last; the lines are still in the prompts' order, each with its own seed's answer."""
    out = tmp_path / "rollouts.jsonl"
    lock, in_flight, most = threading.Lock(), [0], [0]
    overlapped = threading.Event()

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        seed = json.loads(request.split(b"\r\n\r\n", 1)[1])["seed"]
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] > 1:
                overlapped.set()
        overlapped.wait(5)
        time.sleep(0.05 * (45 - seed))  # the earlier seeds answered last
        with lock:
            in_flight[0] -= 1
        connection.sendall(http_json(_completion([seed, 7], [-0.5, -1.0])))

    with scripted_server(script) as (url, _):
        assert main(["endpoint", "--url", url, "--model", "m", "one", "two", "--save-rollouts", str(out),
                     "--samples-per-prompt", "3", "--seed", "40", "--concurrency", "3"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == list(range(40, 46)) and [r["prompt_line"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert [r["completion_ids"][0] for r in rows] == list(range(40, 46))  # each line its own request's answer
    assert most[0] >= 2


def test_concurrency_above_max_in_flight_is_refused(tmp_path, capsys):
    out = tmp_path / "rollouts.jsonl"
    assert main(["endpoint", "--url", "http://127.0.0.1:9/v1", "one", "--save-rollouts", str(out),
                 "--concurrency", "8", "--max-in-flight", "4"]) == 2  # fmt: skip
    assert "--concurrency 8 is above --max-in-flight 4" in capsys.readouterr().err and not out.exists()
    assert main(["endpoint", "--url", "http://127.0.0.1:9/v1", "one", "--save-rollouts", str(out),
                 "--concurrency", "2,4"]) == 2  # fmt: skip
    assert "one level of requests in flight: --concurrency N" in capsys.readouterr().err and not out.exists()
