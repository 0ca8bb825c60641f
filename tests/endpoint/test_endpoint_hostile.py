"""A hostile server: answers of any size, without end or one byte at a time, an echo of the API key, odd URLs.
Each is one line and exit 2 within the limits the user set; no real server can be made to do these."""

from __future__ import annotations

import json
import time
import zlib

import pytest
from helpers.servers import COMPLETION, MODELS, http_json, raw_socket_server, scripted_server

from batchtui.core.cli import main

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


def _endless_chunks(connection, request, stopped):
    connection.sendall(_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b"[" * 0x10000 + b"\r\n"
    for _ in range(4096):  # 256 MiB at most, and only while the client reads
        if stopped.is_set():
            return
        connection.sendall(chunk)


def _announces_8_gb(connection, request, stopped):
    connection.sendall(_HEAD + b"Content-Length: 8589934592\r\n\r\n" + b"{" * 1024)


def _gzip_bomb(connection, request, stopped):
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip: 256 MiB of spaces in about 250 KB
    megabyte = b" " * 2**20
    body = b"".join(packer.compress(megabyte) for _ in range(256)) + packer.flush()
    connection.sendall(_HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (_endless_chunks, "the answer is over the 2 MiB limit (--max-answer-mb)"),
        (_announces_8_gb, "the answer announces 8192 MiB, over the 2 MiB limit (--max-answer-mb)"),
        (_gzip_bomb, "the answer is over the 2 MiB limit (--max-answer-mb)"),
    ],
    ids=["endless", "8-gb", "gzip-bomb"],
)
def test_an_answer_past_the_size_limit_is_one_line_and_exit_2(script, said, capsys):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with scripted_server(script) as (url, _):
        code = main(["endpoint", "--url", url, "--model", "m", "a", "--max-answer-mb", "2", "--timeout", "30"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and said in err, err
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, f"the process grew {grown_mib:.0f} MiB reading a 2 MiB answer"


def _drip(head: bytes):
    def script(connection, request, stopped):
        connection.sendall(head)
        for _ in range(60):  # 30 s at most
            if stopped.wait(0.5):
                return
            connection.sendall(b" ")

    return script


@pytest.mark.parametrize(
    "head", [_HEAD + b"Content-Length: 100000\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Slow: "], ids=["body", "headers"]
)
def test_timeout_bounds_the_whole_request_even_one_byte_at_a_time(head, capsys):
    with scripted_server(_drip(head)) as (url, _):
        started = time.monotonic()
        code = main(["endpoint", "--url", url, "--model", "m", "a", "--timeout", "2"])
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and "no whole answer within 2 s (--timeout)" in err, err
    assert took < 15, f"--timeout 2 took {took:.1f} s against a server sending a byte every 0.5 s"


SECRET = "sk-test-0123456789abcdef"


def test_the_api_key_never_leaves_through_the_server_s_words(tmp_path, monkeypatch, capsys):
    """A 401 that echoes the Authorization header, then a completion whose text is the key."""
    monkeypatch.setenv("SERVER_KEY", SECRET)

    def echo(request: bytes):
        authorization = next(line for line in request.split(b"\r\n") if line.lower().startswith(b"authorization"))
        body = json.dumps({"error": {"message": f"invalid {authorization.decode()}"}}).encode()
        return b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" \
            b"Connection: close\r\n\r\n%s" % (len(body), body)  # fmt: skip

    report = tmp_path / "r.json"
    with raw_socket_server(echo) as (url, received):
        code = main(["endpoint", "--url", url, "--api-key-env", "SERVER_KEY", "a", "--json", str(report)])
    err = capsys.readouterr().err
    assert code == 2 and SECRET.encode() in received[0]  # the key was sent, and came back in the answer
    assert "HTTP 401" in err and "Bearer [api key]" in err and SECRET not in err

    echoed = COMPLETION.replace(b'" ok"', f'" {SECRET}"'.encode())

    def answer(request: bytes):
        return http_json(MODELS if request.startswith(b"GET") else echoed)

    with raw_socket_server(answer) as (url, _):
        code = main(["endpoint", "--url", url, "--api-key-env", "SERVER_KEY", "a", "--rounds", "1",
                     "--concurrency", "1", "--json", str(report)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and SECRET not in out + err + report.read_text()
    assert json.loads(report.read_text())["texts"][0]["alone"]["text"] == " [api key]"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://user:secret@127.0.0.1:1/v1", "holds credentials (user:password@host), which are not sent"),
        ("http://[::1", "is not a valid address"),
        ("http://127.0.0.1:99999/v1", "is not a valid address"),
    ],
)
def test_a_url_with_credentials_or_unparseable_is_one_line_and_exit_2(url, said, capsys):
    assert main(["endpoint", "--url", url, "a"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "secret" not in err


def _completion_with(logprob: str, token_ids: str = "[97]", prompt_ids: str = "[116]") -> bytes:
    """One step " a" with `logprob` written as given (any JSON number), vLLM's token ids beside it."""
    logprobs = f'{{"tokens":[" a"],"token_logprobs":[{logprob}],"top_logprobs":[{{" a":{logprob}}}],"text_offset":[0]}}'
    choice = (
        f'{{"index":0,"text":" a","finish_reason":"length","logprobs":{logprobs},"token_ids":{token_ids},'
        f'"prompt_token_ids":{prompt_ids}}}'
    )
    return f'{{"id":"x","object":"text_completion","created":0,"model":"m","choices":[{choice}]}}'.encode()


def _serving(body: bytes):
    return raw_socket_server(lambda request: http_json(MODELS if request.startswith(b"GET") else body))


@pytest.mark.parametrize(
    ("body", "local", "said"),
    [
        (_completion_with("1" + "0" * 400), [], "/completions: the answer is not a completion"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, [], "the answer is nested too deep to be JSON of the OpenAI API"),
        (_completion_with("-1.0", f"[{2**70}]"), ["--local", "tiny"], f"token id {2**70} is outside the local model"),
        (_completion_with("-1.0", "[97]", "[-5]"), ["--local", "tiny"], "tokenizes it otherwise than the server"),
    ],
    ids=["400-digit-logprob", "nested-100k", "id-2^70", "prompt-id-negative"],
)
def test_hostile_numbers_and_ids_are_one_line_exit_2_and_the_report_kept(body, local, said, tmp_path, capsys):
    report = tmp_path / "r.json"
    with _serving(body) as (url, _):
        code = main(["endpoint", "--url", url, "t", "--rounds", "1", "--concurrency", "1", "--max-new-tokens", "1",
                     "--json", str(report), *local])  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("[")]  # (the progress lines of a log)
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err
    data = json.loads(report.read_text())
    assert said in data["failure"] and data["texts"][0]["line"] == 1


def test_a_served_logprob_of_minus_800_makes_an_infinite_ratio_not_a_crash(tmp_path, capsys):
    """The local model's logprob of the token is near 0: exp(local - served) is past any float."""
    report = tmp_path / "r.json"
    with _serving(_completion_with("-800")) as (url, _):
        code = main(["endpoint", "--url", url, "t", "--rounds", "1", "--concurrency", "1", "--max-new-tokens", "1",
                     "--local", "tiny", "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "importance ratio inf..inf" in out and "1 top-1 disagreement," in out
    local = json.loads(report.read_text())["texts"][0]["served_vs_local"]  # (valid JSON: no Infinity in it)
    assert local["ratio_max"] is None and 700 < local["max_abs_diff"] < 800


def test_served_model_ids_with_a_newline_keep_the_advice_on_one_line(capsys):
    models = json.dumps({"object": "list", "data": [{"id": "a\nb", "object": "model"},
                                                    {"id": "c\x1b[2J", "object": "model"}]}).encode()  # fmt: skip
    with raw_socket_server(lambda request: http_json(models)) as (url, _):
        assert main(["endpoint", "--url", url, "t"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and err.rstrip().endswith("pick one with --model"), err


@pytest.mark.slow
def test_the_run_s_answers_together_are_bounded_not_only_each_one(capsys):
    """Answers of 0.6 MiB under a 1 MiB limit each: alone they pass, one at a time; 8 in flight, each sent in two
    halves seconds apart, would hold 4.8 MiB at once. The run holds at most twice the limit: one line, exit 2."""
    half = 300_000
    body = json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "text": "x" * 2 * half, "finish_reason": "length",
                                    "logprobs": None}]}).encode()  # fmt: skip
    answer = http_json(body)

    posts = []

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        posts.append(request)
        if len(posts) <= 3:  # the probe, alone, alone again: one at a time, whole
            connection.sendall(answer)
            return
        connection.sendall(answer[: len(answer) // 2])
        if not stopped.wait(10.0):  # (long enough for every first half to be read on a busy machine)
            connection.sendall(answer[len(answer) // 2 :])

    with scripted_server(script) as (url, _):
        code = main(["endpoint", "--url", url, "--model", "m", "t", "--concurrency", "8", "--rounds", "1",
                     "--top-logprobs", "0", "--max-answer-mb", "1", "--timeout", "30"])  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not line.startswith("[")]
    assert code == 2 and len(errors) == 1, err
    assert "the answers in flight together are over 2 MiB (2 x --max-answer-mb)" in errors[0]


def test_every_answer_s_bytes_are_given_back_after_a_run():
    from batchtui.core.endpoint.client import Endpoint
    from batchtui.core.endpoint.run import measure_endpoint

    def answer(request: bytes):
        return http_json(MODELS if request.startswith(b"GET") else COMPLETION)

    with raw_socket_server(answer) as (url, _):
        endpoint = Endpoint(url, "m", timeout_s=10)
        result = measure_endpoint(endpoint, ["a", "b"], max_new_tokens=1, concurrency=[1, 2], rounds=1, top_logprobs=0)
        endpoint.close()
    assert result.failure is None and endpoint.budget.held == 0
