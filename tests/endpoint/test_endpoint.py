"""`batchtui endpoint` and `batchtui --url` against a real OpenAI-compatible server (`transformers serve` on the
built-in English model, continuous batching, CPU), and the faults that server can be made to produce (killed mid-run,
a wrong model name). Faults only a raw socket produces: test_endpoint_faults.py; logprobs: test_endpoint_logprobs.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.servers import PROMPTS, stop, transformers_serve

from batchtui.core.cli import main
from batchtui.core.endpoint.checks import CACHE_UNKNOWN, NO_PREFILL
from batchtui.core.endpoint.client import Endpoint
from batchtui.core.endpoint.run import NO_LOGPROBS, NO_PROMPT_LOGPROBS, measure_endpoint
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.xdist_group("endpoint")  # one worker starts the server once for the module

TEXTS = PROMPTS
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


# A step's top-1 margin within which two correct kernels may choose either token: a bfloat16 logit's spacing
# (1/16 between 8 and 16), an exact tie included.
NEAR_TIE = 0.0625


def _local_greedy(model_path, texts: list[str], new_tokens: int) -> list[tuple[list[str], list[float]]]:
    """Each text alone through transformers' generate, greedy: per text, each new token's text and its step's top-1
    margin (what the server should give alone, up to near-ties)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")
            run = model.generate(
                **ids, max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True
            )
            new = run.sequences[0, ids["input_ids"].shape[1] :]
            pieces = [tokenizer.decode(new[: i + 1], skip_special_tokens=True) for i in range(len(new))]
            top = [logits[0].float().topk(2).values for logits in run.logits]
            out.append((pieces, [(t[0] - t[1]).item() for t in top]))
    return out


def _parts_only_at_a_near_tie(served: str, pieces: list[str], margins: list[float]) -> bool:
    """The served continuation is the local one, or parts from it where the local step was a near-tie."""
    if served == pieces[-1]:
        return True
    step = next((i for i, piece in enumerate(pieces) if not served.startswith(piece)), None)
    return step is not None and margins[step] <= NEAR_TIE


def test_alone_the_server_says_what_transformers_says_locally(served, english):
    endpoint = Endpoint(served)
    assert endpoint.resolve_model() == str(english)  # the only model it serves, found by asking
    served_texts = [endpoint.complete(text, NEW_TOKENS).text for text in TEXTS]
    local = _local_greedy(english, TEXTS, NEW_TOKENS)
    assert all(_parts_only_at_a_near_tie(text, *steps) for text, steps in zip(served_texts, local))
    assert sum(text == steps[0][-1] for text, steps in zip(served_texts, local)) >= len(TEXTS) - 2
    assert all(served_texts)


def test_endpoint_command_compares_alone_and_under_load_without_logprobs(served, tmp_path, capsys):
    report = tmp_path / "endpoint.json"
    code = main(["endpoint", "--url", served, *TEXTS, "--max-new-tokens", "24", "--rounds", "2", "--concurrency", "8",
                 "--json", str(report)])  # fmt: skip
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["failure"] is None and data["summary"]["measured"] == len(TEXTS)
    assert data["notes"] == [NO_LOGPROBS, NO_PROMPT_LOGPROBS, NO_PREFILL, CACHE_UNKNOWN]
    assert f"note: {NO_LOGPROBS}" in out
    assert all(e["prefill_vs_decode"] is None and e["prefix_cache"]["cached_tokens"] is None for e in data["texts"])
    assert data["config"]["logprobs"] is False and data["config"]["steps_in"] == "characters"
    assert data["config"]["concurrency"] == [len(TEXTS)] and data["config"]["rounds"] == 2
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
    code = main(["endpoint", "--url", served, "a", "--max-new-tokens", "2", "--rounds", "1", "--concurrency", "1",
                 "--api-key-env", "SERVED_KEY", "--json", str(report)])  # fmt: skip
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


async def test_the_app_with_url_shows_served_continuations_in_the_generation_view(served, tmp_path):
    from helpers.tui_helpers import settle
    from textual.widgets import DataTable

    from batchtui.core.settings import Settings
    from batchtui.tui.app import BatchtuiApp
    from batchtui.tui.run_controller import EndpointTarget
    from batchtui.tui.widgets.generation_pane import GenerationPane
    from batchtui.tui.widgets.status_line import StatusLine

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
        assert "continuations differ under load" in str(pane.query_one("#gen-verdict").content)
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

    result = measure_endpoint(KilledAfterThreeTexts(), TEXTS, max_new_tokens=4, concurrency=8, rounds=1)
    assert result.failure is not None and "connection refused" in result.failure
    kept = [t for t in result.texts if t.alone is not None]
    assert len(kept) == 3  # three texts alone before the fourth request failed
    assert all(not t.measured and t.differs is None for t in result.texts)
    assert result.summary.measured == 0
