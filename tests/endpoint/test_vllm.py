"""`batchtui endpoint` against a real vLLM (its CPU build) serving the built-in English model: the concurrency
ladder and the served checks, each number against requests of this test's own."""

from __future__ import annotations

import json
import urllib.request

import pytest
from helpers.rollout_files import records_in
from helpers.servers import PROMPTS
from helpers.vllm_server import wait_for_vllm

from batchtui.core.cli import main

pytestmark = pytest.mark.xdist_group("vllm")  # one worker waits for the one server

TEXTS = PROMPTS


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
    # its own batch, from its /metrics: read at every level, never more running than in flight, nor than its
    # --max-num-seqs 16 (how many it catches at once depends on how fast this box is: a level can end between reads)
    running = [lv["server_running"] for lv in levels]
    assert all(r is not None and 0 <= r <= min(16, lv["concurrency"]) for r, lv in zip(running, levels))
    assert "the server's own batch per level (its /metrics): 1: " in out
    assert all(not entry["noisy"] for entry in data["texts"])  # greedy alone is deterministic on vLLM's CPU build


def test_prefill_vs_decode_and_the_prefix_cache_on_a_real_vllm(vllm, tmp_path, capsys):
    url, model = vllm
    report = tmp_path / "checks.json"
    assert main(["endpoint", "--url", url, *TEXTS[:3], "--max-new-tokens", "12", "--concurrency", "2",
                 "--rounds", "1", "--json", str(report)]) in (0, 1)  # fmt: skip
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["config"]["token_ids"] is True and data["notes"] == []
    for text, entry in zip(TEXTS, data["texts"]):
        # Our own: the continuation decoded with its ids, then prompt + continuation as one prefill, by token id.
        decoded = ask(url, {"model": model, "prompt": text, "max_tokens": 12, "temperature": 0, "seed": 0,
                            "logprobs": 1, "return_token_ids": True})["choices"][0]  # fmt: skip
        ids = decoded["prompt_token_ids"] + decoded["token_ids"]
        prefill = ask(url, {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
                            "prompt_logprobs": 0})["choices"][0]["prompt_logprobs"]  # fmt: skip
        start = len(decoded["prompt_token_ids"])
        expected = [
            prefill[start + step][str(token)]["logprob"] - logprob
            for step, (token, logprob) in enumerate(zip(decoded["token_ids"], decoded["logprobs"]["token_logprobs"]))
        ]
        checked = entry["prefill_vs_decode"]
        assert checked["diffs"] == expected and checked["steps"] == 12
        assert checked["max_abs_diff"] == max(abs(d) for d in expected)
        first = next((step for step, d in enumerate(expected) if d != 0), None)
        assert checked["first_differing_step"] == first
        cache = entry["prefix_cache"]
        assert cache["cached_tokens"] > 0  # the second request found the first one's prefix
        assert cache["differs"] == (cache["split_step"] is not None or cache["max_abs_diff"] > 0)
    assert "prefill vs decode: " in out and "prefix cache, miss vs hit (" in out


@pytest.mark.parametrize("invariant", [False, True], ids=["local", "local-invariant"])
def test_served_vs_local_matches_a_forward_of_the_served_ids_here(vllm, tmp_path, capsys, invariant):
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from batchtui.core import batch_invariant
    from batchtui.core.models.builtin import builtin_path

    url, model = vllm
    report = tmp_path / "local.json"
    extra = ["--invariant"] if invariant else []
    assert main(["endpoint", "--url", url, *TEXTS[:3], "--max-new-tokens", "12", "--concurrency", "1", "--rounds", "1",
                 "--local", "qwen2-english-4m", *extra, "--json", str(report)]) in (0, 1)  # fmt: skip
    data = json.loads(report.read_text())
    assert data["config"]["local"] == {"model": "qwen2-english-4m", "dtype": "bfloat16", "invariant": invariant}
    local = AutoModelForCausalLM.from_pretrained(builtin_path("qwen2-english-4m")).eval()
    for text, entry in zip(TEXTS, data["texts"]):
        served = ask(url, {"model": model, "prompt": text, "max_tokens": 12, "temperature": 0, "seed": 0,
                           "logprobs": 1, "return_token_ids": True})["choices"][0]  # fmt: skip
        prompt, new = served["prompt_token_ids"], served["token_ids"]
        ids = torch.tensor([prompt + new])
        with torch.inference_mode(), batch_invariant(local) if invariant else torch.inference_mode():
            logprobs = local(input_ids=ids).logits[0].float().log_softmax(-1)
        mine = [logprobs[len(prompt) - 1 + step, token].item() for step, token in enumerate(new)]
        diffs = [lo - se for lo, se in zip(mine, served["logprobs"]["token_logprobs"])]
        checked = entry["served_vs_local"]
        assert checked["diffs"] == diffs and checked["steps"] == 12
        assert checked["max_abs_diff"] == max(abs(d) for d in diffs)
        assert checked["ratio_min"] == min(math.exp(d) for d in diffs)
        assert checked["ratio_max"] == max(math.exp(d) for d in diffs)
        top1 = [logprobs[len(prompt) - 1 + step].argmax().item() != token for step, token in enumerate(new)]
        assert checked["top1_disagree"] == sum(top1)
    assert "served vs local (qwen2-english-4m, bfloat16" in capsys.readouterr().out


def test_a_local_model_with_another_tokenizer_is_refused_in_one_line(vllm, capsys):
    url, _ = vllm
    assert main(["endpoint", "--url", url, "The list of objects is", "--local", "tiny", "--concurrency", "1"]) == 2
    err = capsys.readouterr().err  # the progress lines, then one line with the reason
    assert err.count("batchtui: error:") == 1 and "tokenizes it otherwise than the server does" in err.splitlines()[-1]


async def test_the_app_on_a_real_vllm_charts_the_ladder_and_says_each_text_s_checks(vllm, tmp_path):
    from helpers.tui_helpers import settle

    from batchtui.core.settings import Settings
    from batchtui.tui.app import BatchtuiApp
    from batchtui.tui.run_controller import EndpointTarget
    from batchtui.tui.widgets.ladder_chart import LadderChart

    url, _ = vllm
    app = BatchtuiApp(TEXTS[:4], Settings(model="tiny"), output_dir=tmp_path, endpoint=EndpointTarget(url))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        result = app.state.generation_on_screen
        assert result is not None and result.failure is None
        assert [level.concurrency for level in result.ladder] == [1, 2, 4, 8, 16, 32]  # the default ladder
        ladder = app.query_one(LadderChart)
        assert ladder.display and "concurrency ladder, 3 rounds a level" in str(
            app.query_one("#ladder-caption").render()
        )
        checks = str(app.query_one("#gen-checks").render())
        assert "prefill vs decode: " in checks and "prefix cache (" in checks and "tokens cached" in checks
        await pilot.press("j")  # the next text: its own checks
        await pilot.pause()
        assert str(app.query_one("#gen-checks").render()).startswith("prefill vs decode: ")


def test_rollouts_sampled_from_vllm_and_scored_here_give_the_definitions_numbers(vllm, tmp_path):
    """`endpoint --save-rollouts` samples at temperature 1 (each sample's seed its own), `rollouts` scores them as a
    trainer does; the saved ids and logprobs are the server's own answer to this test's request with the same seed,
    the trainer's logprobs this test's own forward's, and every metric recomputed here from the two."""
    import torch
    from helpers.rollout_files import METRICS, metrics_by_definition, own_logprobs
    from transformers import AutoModelForCausalLM

    from batchtui.core.models.builtin import builtin_path

    url, model = vllm
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in TEXTS[:3]))
    saved, records, report = tmp_path / "rollouts.jsonl", tmp_path / "records.jsonl", tmp_path / "r.json"
    assert main(["endpoint", "--url", url, "--texts-file", str(prompts), "--save-rollouts", str(saved),
                 "--samples-per-prompt", "2", "--max-new-tokens", "10", "--seed", "7"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(rows) == 6 and [r["seed"] for r in rows] == list(range(7, 13))
    again = ask(url, {"model": model, "prompt": TEXTS[1], "max_tokens": 10, "temperature": 1.0, "seed": 9,
                      "logprobs": 1, "return_token_ids": True})["choices"][0]  # fmt: skip
    assert rows[2]["completion_ids"] == again["token_ids"]
    assert rows[2]["logprobs"] == again["logprobs"]["token_logprobs"]
    assert main(["rollouts", str(saved), "--model", "qwen2-english-4m", "--dtype", "float32", "--records",
                 str(records), "--json", str(report), "--quiet"]) == 1  # fmt: skip
    summary = json.loads(report.read_text())["rollouts"]
    local = AutoModelForCausalLM.from_pretrained(builtin_path("qwen2-english-4m"), dtype=torch.float32).eval()
    pairs = []
    with torch.no_grad():
        for record in records_in(records):
            row = rows[record["line"] - 1]
            assert record["sampler_logprobs"] == row["logprobs"]
            mine = own_logprobs(local, row)
            assert max(abs(a - b) for a, b in zip(record["trainer_logprobs"], mine)) < 1e-4
            pairs.append((record["trainer_logprobs"], record["sampler_logprobs"]))
    expected = metrics_by_definition(pairs)
    for name in METRICS:
        assert summary[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15), name
    assert summary["max_abs_diff"] > 1e-3  # vLLM's bfloat16 against a float32 trainer: not noise-free
