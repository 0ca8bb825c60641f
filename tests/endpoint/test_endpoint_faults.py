"""`batchtui endpoint` where no real server can be made to fail that way: nothing listening, a socket that sends
garbage, half an answer, silence or plain text to a TLS client, a server that stops answering under load; URLs and
the missing extra."""

from __future__ import annotations

import json

import pytest
from helpers.commands import start
from helpers.servers import COMPLETION, MODELS, http_json, raw_socket_server

from batchtui.core.cli import main
from batchtui.core.endpoint.client import EndpointError, base_url


def test_nothing_listening_is_one_line_and_exit_2(capsys):
    from helpers.servers import free_port

    assert main(["endpoint", "--url", f"http://127.0.0.1:{free_port()}/v1", "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "connection refused" in err and "Traceback" not in err


GARBAGE = b"\x00\xff garbage, not HTTP \x1b[2J\r\n\r\n"
NOT_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{not json"
HALF_AN_ANSWER = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{"object": "li'


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (GARBAGE, "cannot connect"),
        (NOT_JSON, "not valid JSON"),
        (HALF_AN_ANSWER, "closed the connection"),
        (None, "no whole answer within 1 s (--timeout)"),
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
        process = start([*command, "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while len(posts) < 4:  # the request under load is in flight
                if process.poll() is not None:
                    raise AssertionError(f"ended before the request under load: {process.communicate()}")
                assert time.monotonic() < deadline, f"{len(posts)} requests in 60 s"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)  # far less than the request's 120 s
        finally:
            process.kill()
    assert process.returncode == 130 and err.decode().strip().endswith("batchtui: interrupted"), (
        process.returncode,
        err.decode(),
        [request.split(b"\r\n")[0] for request in received],
    )


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
