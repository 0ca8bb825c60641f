"""The commands' checks of their input (cli_options, settings, texts, models): bad input exits 2 with one
line, never 3 or a traceback, and before the work rather than after it; what is cut is flagged."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

import batchtui.core.run.engine
from batchtui.core import Settings, compare
from batchtui.core.cli.check import run_check
from batchtui.core.cli.probe import run_probe
from batchtui.core.cli.sweep import run_sweep
from batchtui.core.errors import ResourceError
from batchtui.core.models.loading import load_model

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

CLI_CASES = [
    (["", "ok"], "text 1 is empty or whitespace only"),
    (["--max-tokens", "0", "ok"], "max tokens must be at least 1"),
    (["--top-k", "5000", "ok"], "top-k must be at most the vocabulary size 4096"),  # the default model's
    (["--atol", "-1", "ok"], "atol must be a finite number >= 0, not -1.0"),
    (["--rtol", "-0.1", "ok"], "rtol must be a finite number >= 0, not -0.1"),
    (["--batch-size", "0", "ok"], "batch size must be at least 1"),
    (["--model", "not-causal", "ok"], "has a config.json but no weights"),
    (["--model", "no-pad-no-eos", "ok"], "has neither a pad nor an eos token"),
    (["--model", "short-embedding", "ok"], "its tokenizer has 259 tokens but its embedding only 100 rows"),
    (["--model", "short-embedding", "--ops", "ok"], "its tokenizer has 259 tokens but its embedding only 100 rows"),
    (["--model", "short-embedding", "--explain", "kernels", "ok"], "its embedding only 100 rows"),
    (["--model", "nobody/nothing", "ok"], "'nobody/nothing' is not in the local cache and HF_HUB_OFFLINE is set"),
    # The attention is what failed, not the built-in model's folder (which is no hub id).
    (["--model", "tiny", "--attn", "flash", "ok"], "error: attention 'flash' cannot be used with model 'tiny' here:"),
    (["--model", "tiny", "--attn", "flash_attention_2", "ok"], "attention 'flash_attention_2' cannot be used"),
]


LONE_SURROGATE = "caf\udce9"  # what Python makes of the Latin-1 bytes b"caf\xe9" in argv


@pytest.fixture
def no_run(monkeypatch):
    """Fails the test if a comparison starts: these values must be refused before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the run started before the bad value was refused")

    monkeypatch.setattr(batchtui.core.run.engine, "compare", refuse)


BEFORE_THE_RUN = [
    ([LONE_SURROGATE], "text 1 is not valid UTF-8"),
    (["--json", "{tmp}/missing/report.json", "ok"], "does not exist"),
    (["--json", "{tmp}", "ok"], "it is a directory"),
    (["--json", "/proc/batchtui-report.json", "ok"], "cannot write the report to /proc/batchtui-report.json"),
    (["--atol", "nan", "ok"], "atol must be a finite number >= 0, not nan"),
    (["--rtol", "nan", "ok"], "rtol must be a finite number >= 0, not nan"),
    (["--atol", "inf", "ok"], "atol must be a finite number >= 0, not inf"),
    (["--device", "meta", "ok"], "device 'meta' holds no data"),
    (["--texts-file", "/dev/zero"], "is larger than 64 MiB"),
]


@pytest.fixture
def tokenizer_dropping_tildes():
    """The tiny model as the engine holds it, its tokenizer given a normalizer that removes '~' (as some
    tokenizers drop characters they do not know): a text of tildes has no token at all."""
    from tokenizers import normalizers

    backend = load_model(Settings(model="tiny", max_tokens=64)).tokenizer.backend_tokenizer
    saved = backend.normalizer
    backend.normalizer = normalizers.Replace("~", "")
    yield "tiny"
    backend.normalizer = saved


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


def test_long_texts_are_cut_and_flagged(capsys, tmp_path, tiny_path):
    result = compare(["short", "x" * 40], Settings(model="tiny", max_tokens=16))
    short, long = result.texts
    assert not short.truncated and long.truncated and len(long.token_ids) == 16
    assert run_check(["--max-tokens", "16", "--json", "-", "short", "x" * 40]) in (0, 1)
    out = capsys.readouterr()
    assert '"truncated": true' in out.out and "16 cut" in out.err
    context = load_model(Settings(model="tiny")).max_tokens
    assert context == 8192  # the tiny model's max_position_embeddings
    # Without --max-tokens a text is cut at the model's context: the tiny model with a context of 48 positions
    # (a run at 8192 would take seconds for the same check).
    short_context = tmp_path / "tiny-48"
    shutil.copytree(tiny_path, short_context)
    config = json.loads((short_context / "config.json").read_text())
    (short_context / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 48}))
    cut = compare(["y" * 60, "short"], Settings(model=str(short_context), batch_size=1)).texts
    assert cut[0].truncated and len(cut[0].token_ids) == 48 and not cut[1].truncated


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


@pytest.mark.slow
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
    from batchtui.core.models.loading import load_model
    from batchtui.core.run.runner import Runner

    loaded = load_model(Settings(model="qwen2-english-4m"))
    runner = Runner(loaded, "left", "mask", max_tokens=40)
    for text in ("The quick brown fox jumps. " * 400, "a" * 20_000, "  spaces   and\\ttabs " * 900, "日本語" * 5000):
        whole = loaded.tokenizer(text, truncation=True, max_length=40)["input_ids"]
        assert len(runner.bounded(text)) < len(text)
        assert runner.tokenize(text) == (whole, True)


@pytest.mark.parametrize(("args", "message"), BEFORE_THE_RUN)
def test_check_refuses_before_the_run(args, message, tmp_path, no_run, capsys):
    args = [a.format(tmp=tmp_path) for a in args]
    assert run_check(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("dtypes", ["bogus", "int8", "float32,int64"])
def test_probe_refuses_dtypes_it_cannot_multiply(dtypes, capsys):
    assert run_probe(["--dtypes", dtypes, "--sizes", "8", "--batch-sizes", "2", "--repeats", "1"]) == 2
    assert "probe dtypes must be among bfloat16, float16, float32, float64" in capsys.readouterr().err


def test_probe_and_sweep_refuse_meta_and_nan(capsys):
    assert run_probe(["--device", "meta", "--sizes", "8", "--batch-sizes", "2"]) == 2
    assert "device 'meta' holds no data" in capsys.readouterr().err
    assert run_sweep(["--atol", "nan", "--dtypes", "float32", "--batch-sizes", "1", "ok"]) == 2
    assert "atol must be a finite number >= 0, not nan" in capsys.readouterr().err


def test_max_tokens_above_the_context_is_refused(capsys):
    assert run_check(["--max-tokens", "10000", "ok"]) == 2
    err = capsys.readouterr().err
    assert "max tokens 10000 is above the context of qwen2-english-4m (8192 positions): refused" in err


def test_cpu_out_of_memory_gets_the_same_advice_as_cuda(capsys):
    model = load_model(Settings(model="tiny")).model

    def allocator_fails(module, args):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)"
        )

    handle = model.model.layers[0].register_forward_pre_hook(allocator_fails)
    try:
        with pytest.raises(ResourceError, match="out of memory on cpu .* lower the batch size or the text length"):
            compare(["one", "two"], Settings(model="tiny"))
        assert run_check(["--model", "tiny", "one", "two"]) == 2
    finally:
        handle.remove()
    assert "lower the batch size" in capsys.readouterr().err


@pytest.mark.slow
def test_check_into_a_closed_pipe_exits_quietly():
    """`batchtui check | head`: the reader is gone before the table comes; no traceback, no exit 3."""
    child = subprocess.Popen(
        [sys.executable, "-m", "batchtui.core", "check", "--model", "tiny", "--quiet", "some text"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # as `head` does once it has read enough
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141, err
    assert err == ""


def test_texts_files_keep_bytes_and_line_numbers(tmp_path, capsys):
    texts_file = tmp_path / "texts.txt"
    content = "\ufefffirst\r\n\r\nform\x0cfeed\nline\u2028separator\n   \nnext\x85line\n"
    texts_file.write_bytes(content.encode("utf-8"))
    assert run_check(["--texts-file", str(texts_file), "--dtype", "float64", "--json", "-"]) == 0
    captured = capsys.readouterr()
    texts = json.loads(captured.out)["texts"]
    assert [(t["line"], t["text"]) for t in texts] == [
        (1, "first"),
        (3, "form\x0cfeed"),
        (4, "line\u2028separator"),
        (6, "next\x85line"),
    ]
    table_numbers = [line.split()[0] for line in captured.err.splitlines()[2:6]]
    assert table_numbers == ["1", "3", "4", "6"]


def test_a_probe_that_runs_out_of_memory_is_bad_input(capsys):
    """A 200000-wide layer needs 160 GB: the user's input, so one line and exit 2, not an internal error."""
    args = ["--sizes", "200000", "--batch-sizes", "2", "--dtypes", "float32", "--repeats", "1"]
    assert run_probe(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("batchtui: error: out of memory on cpu for a 200000x200000 float32 layer")


@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_text_with_no_token_is_bad_input(tokenizer_dropping_tildes, command, capsys):
    from batchtui.core.cli.generate import run_generate

    run = {"check": run_check, "generate": run_generate}[command]
    assert run(["hello", "~~~", "--model", tokenizer_dropping_tildes, "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "batchtui: error: text 2: the tokenizer gives no token for it, so there is nothing to compare"


def test_a_mistyped_command_is_said_so_and_a_text_after_dashes_opens_the_app(capsys):
    from batchtui.tui.launcher import build_app
    from batchtui.tui.launcher import main as batchtui_main

    assert batchtui_main(["chek"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no command 'chek': did you mean `batchtui check`?" in err
    assert "batchtui -- chek" in err
    app = build_app(["--", "chek"])  # the text itself, after --
    assert not isinstance(app, int) and app.initial_texts == ["chek"]


@pytest.mark.parametrize(
    "argv",
    [
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "a", "--timeout", "inf"],
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "a", "--timeout", "1e10"],
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "a", "--max-answer-mb", "inf"],
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "a", "--max-answer-mb", "nan"],
        ["check", "a", "--repro", "PACK", "--repro-max-mb", "inf"],
        ["check", "a", "--repro", "PACK", "--repro-max-mb", "1e300"],
        ["check", "--from", "PACK", "--repro-max-mb", "-1"],
        ["check", "--from", "PACK", "--repro-max-mb", "0"],
    ],
)
def test_limits_that_are_not_finite_or_out_of_range_are_one_line_and_exit_2(argv, tmp_path, capsys):
    argv = [str(tmp_path / "pack") if a == "PACK" else a for a in argv]
    from batchtui.core.cli import main as core_main

    assert core_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and " must be a number " in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["check", "--invariant=", "a"], "--invariant= names none of the mode's classes"),
        (["check", "--remedy", "invariant:", "a"], "remedy 'invariant:' names none of the mode's classes"),
    ],
)
def test_an_empty_class_list_is_refused_not_run_as_something_else(argv, said, capsys):
    from batchtui.core.cli import main as core_main

    assert core_main(argv) == 2
    assert said in capsys.readouterr().err
