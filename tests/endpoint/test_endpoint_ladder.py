"""The concurrency ladder's order: levels given in any order (or twice) are measured lowest first, once each, and the
first breaking level is the lowest that breaks. The server here answers alike alone and otherwise under any load
(a fake: a real server cannot be made to break at a chosen level)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable

from helpers.servers import MODELS, http_json, scripted_server

from batchtui.core.cli import main


def _completion(text: str) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return json.dumps(
        {"id": "x", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    ).encode()


def _counting_server(answer: Callable[[int], str]):
    """A server whose n-th completion request (from 1) is answered with the text `answer(n)`."""
    answered = [0]
    lock = threading.Lock()

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        with lock:
            answered[0] += 1
            text = answer(answered[0])
        connection.sendall(http_json(_completion(text)))

    return scripted_server(script)


def test_levels_in_any_order_are_measured_lowest_first_and_the_lowest_breaking_is_named(tmp_path, capsys):
    report = tmp_path / "r.json"
    # the probe, the text alone and again (one round): the same answer; every request after them: another
    with _counting_server(lambda n: " ok" if n <= 3 else " no") as (url, received):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--concurrency", "16,8,4,8,2,1", "--rounds", "1",
                     "--top-logprobs", "0", "--json", str(report)])  # fmt: skip
    data = json.loads(report.read_text())
    assert code == 1
    assert data["config"]["concurrency"] == [1, 2, 4, 8, 16]
    assert [level["concurrency"] for level in data["levels"]] == [1, 2, 4, 8, 16]
    assert data["first_breaking_concurrency"] == 1
    posts = [r for r in received if r.startswith(b"POST")]
    ladder = 1 + 2 + 1 + 2 + 4 + 8 + 16  # the probe, alone twice, each level once (the level given twice: once)
    assert ladder <= len(posts) < ladder + 8  # (and the served checks' few requests)


def test_a_server_that_answers_otherwise_by_itself_is_said_so_and_no_level_breaks_for_it(tmp_path, capsys):
    """Every other request answers otherwise whatever is in flight: the server's own noise. Alone, asked again as
    many times as a level is tried, it differs; the ladder counts only texts whose answers alone do not move, so no
    level breaks, and the verdict says the server is nondeterministic by itself."""
    report = tmp_path / "r.json"
    with _counting_server(lambda n: " ok" if n % 2 else " no") as (url, received):
        code = main(["endpoint", "--url", url, "--model", "m", "one", "--concurrency", "1,2,4", "--rounds", "2",
                     "--top-logprobs", "0", "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert code == 1  # the answers do differ
    assert data["summary"]["alone_differ"] == 1 and data["texts"][0]["noisy"]
    assert len(data["texts"][0]["alone_more"]) == 1  # alone, then again twice (as a level's two rounds)
    assert data["first_breaking_concurrency"] is None
    assert [level["texts_noisy"] for level in data["levels"]] == [1, 1, 1]
    assert all(level["texts_split"] == 0 for level in data["levels"])
    verdict = out.splitlines()[-1]
    assert "no level breaks" in verdict and "the server is nondeterministic by itself" in verdict
    assert "(1 of them differ alone too)" in verdict


def test_a_ladder_past_the_bounds_is_refused_in_one_line_before_any_request(capsys):
    with scripted_server(lambda connection, request, stopped: connection.sendall(http_json(MODELS))) as (url, seen):
        assert main(["endpoint", "--url", url, "one", "--concurrency", "100000"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "concurrency 100000 is above --max-in-flight 256" in err
        assert main(["endpoint", "--url", url, "one", "--concurrency", "300", "--max-in-flight", "300",
                     "--rounds", "400"]) == 2  # fmt: skip
        assert "more than 100000: give fewer levels, rounds or texts" in capsys.readouterr().err
    assert seen == []  # refused before the first request


def test_a_level_above_the_http_pool_s_default_is_in_flight_whole():
    """150 requests in flight at once reach the server at once: the connection pool is sized to the ladder (its
    default, 100, queued the other 50 behind them). The server holds each request until all 150 are in, or 40 s
    (threads start slowly on a busy 2-core box: more than 100 at once is the pool's proof)."""
    import time

    from batchtui.core.endpoint.client import Endpoint
    from batchtui.core.endpoint.run import measure_endpoint

    inside, most, posts = [0], [0], [0]
    lock = threading.Lock()
    everyone = threading.Event()

    def script(connection, request, stopped):
        if request.startswith(b"GET /v1/models"):
            connection.sendall(http_json(MODELS))
            return
        with lock:
            posts[0] += 1
            level = 3 < posts[0] <= 3 + 150  # after the probe, alone and alone again: the level's requests
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            if inside[0] >= 150:
                everyone.set()
        if level:
            everyone.wait(40)
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        connection.sendall(http_json(_completion(" ok")))

    with scripted_server(script) as (url, _):
        endpoint = Endpoint(url, "m", max_in_flight=150)
        try:
            measure_endpoint(endpoint, ["one"], concurrency=150, rounds=1, top_logprobs=0, max_in_flight=150)
        finally:
            endpoint.close()
    assert most[0] > 100


def test_a_run_after_a_cancelled_one_measures_alone_only_once_the_old_requests_have_ended(monkeypatch):
    """The first run is cancelled while its level's requests are held by the server; the second run's first
    request (its probe) is sent only after every one of them has been answered, never beside them."""
    from batchtui.core.endpoint import run
    from batchtui.core.endpoint.run import measure_endpoint

    # this test's own count of requests in flight: another test's abandoned requests (ending by their deadline, in
    # this process) are not this one's to wait for
    monkeypatch.setattr(run, "_IN_FLIGHT", run._RequestsInFlight())
    from batchtui.core.errors import Cancelled
    from batchtui.core.run.backend import ServedContinuation

    log, held, release = [], threading.Event(), threading.Event()
    answer = ServedContinuation(" ok", "length", None, None)

    class Server:
        def __init__(self, name: str, hold: bool) -> None:
            self.name, self.hold, self.calls = name, hold, 0

        def complete(self, text, max_new_tokens, top_logprobs=0, prompt_logprobs=0, token_ids=False):
            self.calls += 1
            log.append((self.name, "sent"))
            if self.hold and self.calls > 5:  # the probe, two texts alone and alone again answered; the level held
                held.set()
                release.wait(10)
            log.append((self.name, "answered"))
            return answer

    def first_run() -> None:
        with contextlib.suppress(Cancelled):
            measure_endpoint(Server("old", True), ["t", "u"], max_new_tokens=1, concurrency=2, rounds=1,
                             top_logprobs=0, cancelled=held.is_set)  # fmt: skip

    old = threading.Thread(target=first_run)
    old.start()
    assert held.wait(10)
    old.join(10)  # cancelled: it has returned, its two requests still in flight
    second = threading.Thread(
        target=measure_endpoint, args=(Server("new", False), ["t"]), kwargs={"max_new_tokens": 1, "concurrency": 1,
                                                                             "rounds": 1, "top_logprobs": 0}
    )  # fmt: skip
    second.start()
    time.sleep(0.5)
    assert ("new", "sent") not in log  # waiting for the old requests
    release.set()
    second.join(10)
    first_new = log.index(("new", "sent"))
    assert log[:first_new].count(("old", "answered")) == log.count(("old", "sent"))
