"""The concurrency ladder's order: levels given in any order (or twice) are measured lowest first, once each, and the
first breaking level is the lowest that breaks. The server here answers alike alone and otherwise under any load
(a fake: a real server cannot be made to break at a chosen level)."""

from __future__ import annotations

import json
import threading

from servers import http_json, scripted_server
from test_endpoint_faults import MODELS

from batchtui.core.cli import main


def _completion(text: str) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return json.dumps(
        {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    ).encode()


def test_levels_in_any_order_are_measured_lowest_first_and_the_lowest_breaking_is_named(tmp_path, capsys):
    answered = [0]
    lock = threading.Lock()

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        with lock:
            answered[0] += 1
            alone = answered[0] <= 2  # the text alone, twice: the same; every request after it: another answer
        connection.sendall(http_json(_completion(" ok" if alone else " no")))

    report = tmp_path / "r.json"
    with scripted_server(script) as (url, received):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--concurrency", "16,8,4,8,2,1", "--rounds", "1",
                     "--top-logprobs", "0", "--json", str(report)])  # fmt: skip
    data = json.loads(report.read_text())
    assert code == 1
    assert data["config"]["concurrency"] == [1, 2, 4, 8, 16]
    assert [level["concurrency"] for level in data["levels"]] == [1, 2, 4, 8, 16]
    assert data["first_breaking_concurrency"] == 1
    posts = [r for r in received if r.startswith(b"POST")]
    ladder = 2 + 1 + 2 + 4 + 8 + 16  # alone twice, then each level once (the level given twice: once)
    assert ladder <= len(posts) < ladder + 8  # (and the served checks' few requests)
