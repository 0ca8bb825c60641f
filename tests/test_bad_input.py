"""Every bad input: the CLI exits 2 with one line, the app shows a notification and keeps the texts."""

import pytest
import torch
from bad_models import not_a_causal_lm, tokenizer_without_pad_or_eos
from tui_helpers import make_app, settle

from batchtui.core import Settings, compare
from batchtui.core.cli_check import run_check
from batchtui.core.errors import ResourceError
from batchtui.core.models import load_model

TEXTS = ["first text", "a second, longer text"]


@pytest.fixture
def broken(tmp_path, tiny_path):
    return {
        "not-causal": str(not_a_causal_lm(tmp_path / "bert")),
        "no-pad-no-eos": str(tokenizer_without_pad_or_eos(tiny_path, tmp_path / "nopad")),
    }


CLI_CASES = [
    (["", "ok"], "text 1 is empty or whitespace only"),
    (["--max-tokens", "0", "ok"], "max tokens must be at least 1"),
    (["--top-k", "5000", "ok"], "top-k must be at most the vocabulary size 4096"),  # the default model's
    (["--atol", "-1", "ok"], "atol must be a finite number >= 0, not -1.0"),
    (["--rtol", "-0.1", "ok"], "rtol must be a finite number >= 0, not -0.1"),
    (["--batch-size", "0", "ok"], "batch size must be at least 1"),
    (["--model", "not-causal", "ok"], "has a config.json but no weights"),
    (["--model", "no-pad-no-eos", "ok"], "has neither a pad nor an eos token"),
    (["--model", "nobody/nothing", "ok"], "'nobody/nothing' is not in the local cache and HF_HUB_OFFLINE is set"),
]


@pytest.mark.parametrize(("args", "message"), CLI_CASES)
def test_cli_bad_input(args, message, broken, capsys):
    args = [broken.get(a, a) for a in args]
    assert run_check(args) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and message in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_hub_unreachable_message_suggests_a_local_path(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the Hub is unreachable
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    assert run_check(["--model", "nobody/nothing", "ok"]) == 2
    assert "'nobody/nothing' is not in the local cache and the hub cannot be reached" in capsys.readouterr().err


TUI_CASES = [
    ({"model": "not-causal"}, "has a config.json but no weights"),
    ({"model": "no-pad-no-eos"}, "has neither a pad nor an eos token"),
    ({"top_k": 600}, "top-k must be at most the vocabulary size 512"),
    ({"model": "nobody/nothing"}, "hub id 'nobody/nothing' is not in the local cache"),
]


@pytest.mark.parametrize(("settings", "message"), TUI_CASES)
async def test_app_bad_input_notifies_and_keeps_the_texts(settings, message, broken):
    settings = {k: broken.get(v, v) for k, v in settings.items()}
    app = make_app(texts=TEXTS, **settings)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        assert any(message in n.message for n in app._notifications)
        assert app.is_running
        assert app.query_one("#editor").text == "\n".join(TEXTS)


async def test_app_bad_tolerance_typed_is_refused_and_blank_lines_are_counted():
    app = make_app(texts=["one", "", "   ", "two"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert [t.text for t in app.state.comparison.texts] == ["one", "two"]
        assert "2 blank lines skipped" in app.query_one("#status").full_text()
        field = app.query_one("#atol")
        field.value = "-1"
        await field.action_submit()
        await pilot.pause()
        assert any("atol must be a finite number >= 0" in n.message for n in app._notifications)
        field.value = "abc"
        await field.action_submit()
        await pilot.pause()
        assert any("atol must be a number, not 'abc'" in n.message for n in app._notifications)
        assert app.state.settings.atol == 1e-5 and app.is_running


def test_long_texts_are_cut_and_flagged(capsys):
    result = compare(["short", "x" * 40], Settings(model="tiny", max_tokens=16))
    short, long = result.texts
    assert not short.truncated and long.truncated and len(long.token_ids) == 16
    assert run_check(["--max-tokens", "16", "--json", "-", "short", "x" * 40]) in (0, 1)
    out = capsys.readouterr()
    assert '"truncated": true' in out.out and "16 cut" in out.err
    context = load_model(Settings(model="tiny")).max_tokens
    assert context == 8192  # the tiny model's max_position_embeddings
    assert compare(["y" * 8200], Settings(model="tiny", batch_size=1)).texts[0].truncated


def test_out_of_memory_stops_the_run_and_the_next_one_works():
    texts = ["one text", "another text"]
    model = load_model(Settings(model="tiny")).model

    def exhausted(module, args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    handle = model.model.layers[1].register_forward_pre_hook(exhausted)
    try:
        with pytest.raises(ResourceError, match="out of memory on cpu .* lower the batch size or the text length"):
            compare(texts, Settings(model="tiny"))
    finally:
        handle.remove()
    assert compare(texts, Settings(model="tiny")).summary.texts == 2


async def test_app_survives_out_of_memory():
    app = make_app(texts=TEXTS)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        model = load_model(app.state.settings).model
        handle = model.model.layers[0].register_forward_pre_hook(
            lambda m, a: (_ for _ in ()).throw(torch.OutOfMemoryError("out of memory"))
        )
        try:
            await pilot.press("r")
            await settle(pilot, app)
        finally:
            handle.remove()
        assert any("lower the batch size" in n.message for n in app._notifications)
        await pilot.press("r")
        await settle(pilot, app)
        assert app.state.comparison is not None and app.is_running


def test_a_10_mb_text_is_cut_before_it_is_tokenized(tmp_path):
    """Only a prefix that surely holds --max-tokens tokens is tokenized: a 10 MB text stays within memory
    (it took 3.3 GB whole; a 60 MB one aborted) and comes out cut and flagged."""
    import os
    import subprocess
    import sys
    import threading

    big = tmp_path / "big.txt"
    big.write_text("word " * 2_000_000 + "\n")
    command = [sys.executable, "-m", "batchtui.core", "check", "--model", "tiny", "--max-tokens", "64"]
    process = subprocess.Popen([*command, "--texts-file", str(big)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watchdog = threading.Timer(180, process.kill)  # wait4 has no timeout of its own
    watchdog.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak memory
    finally:
        watchdog.cancel()
    out = process.stdout.read().decode()
    assert os.waitstatus_to_exitcode(status) == 0 and "64 cut" in out
    assert usage.ru_maxrss < 1_500_000  # kB: the interpreter, torch and the model, not the text


def test_a_cut_prefix_gives_the_whole_text_s_tokens_up_to_the_cut():
    from batchtui.core.models import load_model
    from batchtui.core.runner import Runner

    loaded = load_model(Settings(model="qwen2-english-4m"))
    runner = Runner(loaded, "left", "mask", max_tokens=40)
    for text in ("The quick brown fox jumps. " * 400, "a" * 20_000, "  spaces   and\\ttabs " * 900, "日本語" * 5000):
        whole = loaded.tokenizer(text, truncation=True, max_length=40)["input_ids"]
        assert len(runner.bounded(text)) < len(text)
        assert runner.tokenize(text) == (whole, True)
