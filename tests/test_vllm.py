"""`batchtui endpoint` against a real vLLM (its CPU build) serving the built-in English model: the concurrency
ladder and the served checks, each number against requests of this test's own."""

from __future__ import annotations

import json
import urllib.request

import pytest
from vllm_server import wait_for_vllm

from batchtui.core.cli import main

pytestmark = pytest.mark.xdist_group("vllm")  # one worker waits for the one server

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


@pytest.fixture(scope="module")
def vllm():
    return wait_for_vllm()


def ask(url: str, body: dict) -> dict:
    """One completion request of the test's own, straight to the server."""
    request = urllib.request.Request(
        f"{url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.load(answer)


def test_the_ladder_on_a_real_vllm_with_logprobs(vllm, tmp_path, capsys):
    url, model = vllm
    report = tmp_path / "ladder.json"
    code = main(["endpoint", "--url", url, *TEXTS, "--max-new-tokens", "16", "--concurrency", "1,4,16",
                 "--rounds", "2", "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["failure"] is None and data["config"]["logprobs"] and data["config"]["prompt_logprobs"]
    assert data["config"]["steps_in"] == "tokens" and data["notes"] == []
    levels = data["levels"]
    assert [(lv["concurrency"], lv["rounds"]) for lv in levels] == [(1, 2), (4, 2), (16, 2)]
    breaking = [lv["concurrency"] for lv in levels if lv["texts_split"] or lv["texts_logprobs_differ"]]
    assert data["first_breaking_concurrency"] == (breaking[0] if breaking else None)
    for entry in data["texts"]:  # alone twice: the same tokens, the same logprobs to the bit
        assert entry["alone"]["tokens"] == entry["alone_again"]["tokens"]
        assert entry["alone"]["logprobs"] == entry["alone_again"]["logprobs"]
        assert len(entry["rounds"]) == 2 * (1 + 1 + 2)  # at 16 in flight, each of the 8 texts goes twice a round
    own = ask(url, {"model": model, "prompt": TEXTS[0], "max_tokens": 16, "temperature": 0, "seed": 0, "logprobs": 5})
    served = own["choices"][0]["logprobs"]
    assert data["texts"][0]["alone"]["tokens"] == served["tokens"]
    assert data["texts"][0]["alone"]["logprobs"] == served["token_logprobs"]
    s = data["summary"]
    assert code == (1 if s["differ"] or s["logprobs_differ"] or s["alone_differ"] else 0)
    assert "concurrency 1,4,16; 2 rounds" in out
