"""`batchtui check`: the table, the JSON contract and the exit codes."""

import json
import os
import subprocess
import sys

import pytest
from conftest import MIXED_TEXTS

from batchtui.core.cli import main as core_main
from batchtui.core.cli.check import run_check
from batchtui.tui.launcher import main as batchtui_main

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

POSITION_FIELDS = {
    "index",
    "token",
    "max_abs_diff",
    "mean_abs_diff",
    "kl",
    "top1_flip",
    "margin",
    "topk_batch",
    "topk_single",
}


def test_all_allclose_exits_0_with_table_and_verdict(capsys):
    assert run_check(["--batch-size", "1", *MIXED_TEXTS]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for column in ("tokens", "max|Δ|", "KL max", "flips", "worst pos", "allclose"):
        assert column in header
    assert len([line for line in out.splitlines() if line.rstrip().endswith("yes")]) == len(MIXED_TEXTS)
    assert out.splitlines()[-1].startswith("OK: all 6 texts allclose")


def test_divergence_exits_1_and_json_has_the_contract(tmp_path, capsys):
    report = tmp_path / "report.json"
    code = batchtui_main(
        ["check", "--dtype", "bfloat16", "--positions", "arange", "--top-k", "3", "--json", str(report), *MIXED_TEXTS]
    )
    assert code == 1
    assert "DIVERGED" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert {"config", "summary", "texts"} <= data.keys()
    assert set(data["summary"]) >= {"texts", "diverged", "max_abs_diff", "top1_flips"}
    assert data["summary"]["texts"] == 6 and data["summary"]["diverged"] >= 1
    assert data["config"]["dtype"] == "bfloat16" and data["config"]["positions"] == "arange"
    for text, source in zip(data["texts"], MIXED_TEXTS):
        assert text["text"] == source
        assert {"text", "tokens", "allclose", "max_abs_diff", "top1_flips", "positions", "layers"} <= text.keys()
        assert len(text["positions"]) == len(text["tokens"])
        for position in text["positions"]:
            assert POSITION_FIELDS <= position.keys()
            assert len(position["topk_batch"]) == 3
            token_id, token, logit = position["topk_single"][0]
            assert isinstance(token_id, int) and isinstance(token, str) and isinstance(logit, float)
        for layer in text["layers"]:
            assert {"layer", "max_abs_diff", "rel_l2"} <= layer.keys()
    worst = max(data["texts"], key=lambda t: t["max_abs_diff"])
    assert worst["max_abs_diff"] == data["summary"]["max_abs_diff"]
    assert worst["max_abs_diff"] == max(p["max_abs_diff"] for p in worst["positions"])


def test_json_to_stdout_stays_parseable(capsys):
    assert run_check(["--json", "-", "--batch-size", "1", "hello"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"]["diverged"] == 0
    assert "OK: all 1 texts" in captured.err


def test_texts_file_and_default_set(tmp_path, capsys):
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("first line\n\nsecond line\n", encoding="utf-8")
    # float64: allclose on every CPU (bf16 padded rows equal their singles only on some CPUs' kernels).
    assert run_check(["--texts-file", str(texts_file), "--dtype", "float64", "--json", "-"]) == 0
    texts = json.loads(capsys.readouterr().out)["texts"]
    assert [(t["line"], t["text"]) for t in texts] == [(1, "first line"), (3, "second line")]
    run_check(["--json", "-"])
    assert [t["text"] for t in json.loads(capsys.readouterr().out)["texts"]][:3] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["", "ok"], "text 1 is empty or whitespace only"),
        (["ok", " \t "], "text 2 is empty or whitespace only"),
        (["--texts-file", "/no/such/file.txt"], "cannot read texts file '/no/such/file.txt'"),
        (["--model", "no-such-org/no-such-model", "ok"], "'no-such-org/no-such-model' is not in the local cache"),
        (["--batch-size", "0", "ok"], "batch size must be at least 1"),
        (["--top-k", "0", "ok"], "top-k must be at least 1"),
        (["--dtype", "int8", "ok"], "argument --dtype: invalid choice"),
        (["--batch-size", "many", "ok"], "argument --batch-size: invalid int value"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message, capsys):
    assert run_check(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_unreadable_utf8_texts_file(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe broken\n")
    assert run_check(["--texts-file", str(bad)]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_core_runs_check_without_the_tui():
    # A bare GPU box has torch + transformers only; block textual to prove core never needs it.
    blocker = (
        "import sys, runpy; sys.modules['textual'] = None; "
        "sys.argv = ['batchtui.core', 'check', '--batch-size', '1', 'hi']; "
        "runpy.run_module('batchtui.core', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, env=os.environ, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "OK: all 1 texts allclose" in done.stdout
    assert core_main(["nonsense"]) == 2


def test_every_command_answers_help_without_loading_torch():
    """--help and usage errors answer at once: torch (over a second to import) loads only for a run."""
    from batchtui.core.cli import COMMANDS

    script = (
        "import sys; sys.modules['torch'] = None; from batchtui.core.cli import main; "
        f"print([main([name, '--help']) for name in {list(COMMANDS)!r}])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str([0] * len(COMMANDS))


def test_a_bad_value_is_refused_without_loading_torch():
    """A run's settings, texts and destinations are checked before torch loads: a mistyped value answers at once."""
    runs = [
        ["check", "--top-k", "0", "x"],
        ["check", "--json", "/no/such/folder/report.json", "x"],
        ["generate", "--atol", "nan", "x"],
        ["sweep", "--batch-size", "0", "x"],
        ["bench", "--batch-size", "0"],
    ]
    blocked = "import sys; sys.modules['torch'] = None"
    script = f"{blocked}; from batchtui.core.cli import main; print([main(run) for run in {runs!r}])"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == str([2] * len(runs)), done.stderr
    errors = done.stderr.strip().splitlines()
    assert len(errors) == len(runs) and all(line.startswith("batchtui: error: ") for line in errors), errors
    assert "top-k must be at least 1, not 0" in errors[0] and "batch size must be at least 1, not 0" in errors[4]


def test_console_script_exit_code():
    done = subprocess.run(["batchtui", "check", "--top-k", "-1", "x"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == "batchtui: error: top-k must be at least 1, not -1"


def test_table_columns_stay_aligned_with_wide_characters_and_combining_marks():
    """Every row of the table ends its text column at the same terminal column: a wide character takes two
    columns, a combining mark none (counted by an independent rule here: East Asian width and Mn)."""
    import unicodedata

    from batchtui.core.terminal.plain import format_columns

    def on_screen(text):
        return sum(
            0 if unicodedata.category(ch) == "Mn" else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
            for ch in text
        )

    cells = ["日本語のテキスト", "e\u0301e\u0301e\u0301", "plain", "ｆｕｌｌ"]
    table = format_columns(("#", "text", "n"), [(str(i), text, "7") for i, text in enumerate(cells)], left={1})
    lines = table.splitlines()
    assert len({on_screen(line) for line in lines}) == 1, table


def test_threads_option_sets_the_cpu_threads_and_the_default_is_torch_s(capsys):
    import torch

    from batchtui.core.threads import default_threads, use_threads

    assert run_check(["--threads", "1", "--model", "tiny", "hello"]) == 0
    assert torch.get_num_threads() == 1
    for command in (["generate", "--max-new-tokens", "2"], ["sweep", "--dtypes", "float32", "--batch-sizes", "2"]):
        torch.set_num_threads(2)
        assert core_main([*command, "--threads", "1", "--model", "tiny", "hello"]) == 0
        assert torch.get_num_threads() == 1, command
    assert run_check(["--threads", "0", "hello"]) == 2
    assert "--threads: must be a whole number of at least 1" in capsys.readouterr().err
    assert use_threads(None) == default_threads() and torch.get_num_threads() == default_threads()


def test_bitwise_judges_every_logit_and_the_remedy_says_the_line_for_one_s_own_code(capsys):
    """float32 on the English model: allclose, and bitwise equal or not as this machine's kernels decide (a text
    equal on one CPU differs on another): `--bitwise` (atol 0, rtol 0) judges as the engine's own run with those
    tolerances does, here, and says so; with `--remedy invariant` the mode's line for one's own code follows the
    table; the app's status line says which verdict it uses."""
    from batchtui.core import Settings, compare
    from batchtui.tui.views.navigation import describe_outcome

    main = core_main
    texts = ["a", "The quick brown fox"]
    result = compare(texts, Settings(model="qwen2-english-4m", dtype="float32", atol=0.0, rtol=0.0))
    diverged = result.summary.diverged  # (this machine's kernels' to say)
    assert diverged == sum(text.max_abs_diff != 0 for text in result.texts)
    base = ["check", "--model", "qwen2-english-4m", "--dtype", "float32", *texts]
    assert main(base) == 0 and "OK: all 2 texts allclose" in capsys.readouterr().out
    assert main([*base, "--bitwise"]) == (1 if diverged else 0)
    out = capsys.readouterr().out
    said = f"DIVERGED: {diverged} of 2 texts not bitwise equal" if diverged else "OK: all 2 texts bitwise equal"
    assert said in out and "atol 0 rtol 0" in out
    assert main([*base, "--bitwise", "--atol", "1e-3"]) == 2
    assert "--bitwise is --atol 0 --rtol 0" in capsys.readouterr().err
    assert main([*base, "--bitwise", "--remedy", "invariant"]) == 0
    assert "in your code: from batchtui.core import batch_invariant; with batch_invariant(model): ..." in (
        capsys.readouterr().out
    )
    assert describe_outcome(result, 8)[0].startswith(f"{diverged}/2 texts diverge (bitwise)")
