"""The server's own batch per level of the ladder, from its Prometheus metrics (vLLM's gauges): parsed from the text
format, read while each level runs, and the level from which the server ran no more at once said. A fake server
here runs at most 4 requests at once and keeps the rest waiting (a real vLLM's are in test_vllm.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers.servers import MODELS, http_json, scripted_server

from batchtui.core.cli import main
from batchtui.core.endpoint.server_batch import gauges

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:num_requests_running{engine="2",model_name="m"} NaN
junk line
"""


def test_the_gauges_are_summed_over_their_series_and_nothing_else_is_read():
    assert gauges(METRICS) == (5, 7)
    assert gauges("# no gauges\nprocess_cpu_seconds_total 3.0\n") is None
    assert gauges("vllm:num_requests_waiting 2\n") == (0, 2)


@pytest.mark.slow
def test_each_level_says_the_server_s_batch_and_where_it_was_full(tmp_path, capsys):
    lock = threading.Lock()
    in_flight = [0]

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        if request.startswith(b"GET /metrics"):
            with lock:
                running, waiting = min(in_flight[0], 4), max(0, in_flight[0] - 4)
            text = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n".encode()
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                               b"Connection: close\r\n\r\n%s" % (len(text), text))  # fmt: skip
            return
        with lock:
            in_flight[0] += 1
        time.sleep(1.5)  # long enough for the metrics to be read meanwhile, and a level's threads to start (busy box)
        with lock:
            in_flight[0] -= 1
        choice = {"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}
        answer = {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
        connection.sendall(http_json(json.dumps(answer).encode()))

    report = tmp_path / "r.json"
    with scripted_server(script) as (url, _):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--concurrency", "1,2,4,8", "--rounds", "1",
                     "--top-logprobs", "0", "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    levels = json.loads(report.read_text())["levels"]
    assert [(lv["server_running"], lv["server_waiting"]) for lv in levels[:3]] == [(1, 0), (2, 0), (4, 0)]
    assert levels[3]["server_running"] == 4 and 1 <= levels[3]["server_waiting"] <= 4
    line = next(line for line in out.splitlines() if line.startswith("the server's own batch"))
    assert "8: 4 running, " in line and "from 8 in flight it ran no more at once" in line


def test_a_server_without_metrics_is_asked_once_and_the_report_says_nothing(tmp_path, capsys):
    asked = []

    def script(connection, request, stopped):
        if request.startswith(b"GET /metrics"):
            asked.append(1)
            connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        choice = {"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}
        answer = {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
        connection.sendall(http_json(json.dumps(answer).encode()))

    report = tmp_path / "r.json"
    with scripted_server(script) as (url, _):
        assert main(["endpoint", "--url", url, "--model", "m", "one", "--concurrency", "1,2", "--rounds", "2",
                     "--top-logprobs", "0", "--json", str(report)]) == 0  # fmt: skip
    assert len(asked) == 1
    assert all(lv["server_running"] is None for lv in json.loads(report.read_text())["levels"])
    assert "the server's own batch" not in capsys.readouterr().out
