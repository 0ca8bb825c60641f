"""Bad values exit 2 with one line, never 3 or a traceback, and before the work rather than after it."""

import json
import subprocess
import sys

import pytest
from textual import events
from tui_helpers import make_app, settle

import batchtui.core.engine
from batchtui.core import Settings, compare
from batchtui.core import session as session_file
from batchtui.core.cli_check import run_check
from batchtui.core.cli_probe import run_probe
from batchtui.core.cli_sweep import run_sweep
from batchtui.core.errors import ResourceError
from batchtui.core.models import load_model
from batchtui.tui.launcher import build_app

LONE_SURROGATE = "caf\udce9"  # what Python makes of the Latin-1 bytes b"caf\xe9" in argv


@pytest.fixture
def no_run(monkeypatch):
    """Fails the test if a comparison starts: these values must be refused before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the run started before the bad value was refused")

    monkeypatch.setattr(batchtui.core.engine, "compare", refuse)


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


def test_check_into_a_closed_pipe_exits_quietly():
    """`batchtui check | head`: the reader is gone before the table comes; no traceback, no exit 3."""
    child = subprocess.Popen(
        [sys.executable, "-m", "batchtui.core", "check", "--batch-size", "1", *(["some text"] * 40)],
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


def test_the_command_line_wins_even_at_the_default(tmp_path):
    path = tmp_path / "session.json"
    saved = Settings(model="tiny", batch_size=4, dtype="float32", padding_side="right", atol=0.5, decompose=True)
    session_file.save(path, "kept", saved)
    restored = build_app(["--session", str(path)])
    assert (
        restored.state.settings.batch_size,
        restored.state.settings.padding_side,
        restored.state.settings.decompose,
    ) == (
        4,
        "right",
        True,
    )
    app = build_app(
        ["--session", str(path), "--batch-size", "8", "--dtype", "auto", "--padding-side", "left", "--atol", "1e-5"]
    )
    assert app.initial_texts == ["kept"]
    assert (app.state.settings.batch_size, app.state.settings.dtype, app.state.settings.padding_side) == (
        8,
        "auto",
        "left",
    )
    assert app.state.settings.atol == 1e-5 and app.state.settings.decompose is True  # not given: the session's


def test_a_non_utf8_text_never_reaches_the_app_or_its_session(tmp_path, capsys):
    path = tmp_path / "session.json"
    assert build_app(["--session", str(path), LONE_SURROGATE]) == 2
    assert "text 1 is not valid UTF-8" in capsys.readouterr().err
    assert not path.exists()


async def test_a_lone_surrogate_pasted_in_the_app_is_saved_and_refused_by_the_run(tmp_path):
    path = tmp_path / "session.json"
    app = make_app(texts=["fine"])
    app.session_path = path
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot, app)
        await pilot.press("e", "end")
        app.post_message(events.Paste(f"\n{LONE_SURROGATE}"))  # a paste of broken bytes, as the terminal sends it
        await pilot.pause(0.7)
        await settle(pilot, app)
        assert any("text 2 is not valid UTF-8" in n.message for n in app._notifications)
        assert app.query_one("#editor").text == "fine\ncaf\\udce9"  # shown escaped: no terminal prints it
        assert app.is_running
    assert json.loads(path.read_text())["text"] == f"fine\n{LONE_SURROGATE}"
    restarted = build_app(["--session", str(path)])
    assert restarted.initial_texts == ["fine", LONE_SURROGATE]  # starts, the text kept for the user to fix


async def test_nan_typed_into_a_tolerance_is_refused_and_the_field_restored():
    app = make_app(texts=["one"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        generation = app.state.run_number
        for typed in ("nan", "inf", "-inf"):
            field = app.query_one("#rtol")
            field.value = typed
            await field.action_submit()
            await pilot.pause()
            assert field.value == "0.001"
        assert app.state.settings.rtol == 1e-3 and app.state.run_number == generation
        assert any("rtol must be a finite number >= 0, not nan" in n.message for n in app._notifications)


async def test_app_numbers_texts_by_their_editor_line():
    app = make_app(texts=["one", "", "  ", "two"])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert [(t.line, t.text) for t in app.state.comparison.texts] == [(1, "one"), (4, "two")]
        table = app.query_one("#summary")
        assert [str(table.get_row_at(row)[0]) for row in range(table.row_count)] == ["1", "4"]
        await pilot.press("j")
        assert str(app.query_one("#detail").border_title) == "text 4 · position 0"
        assert str(app.query_one("#heatmap").border_subtitle) == "text 4 · pos 0"
        assert str(app.query_one("#layers").border_title).endswith(" text 4")


def test_a_probe_that_runs_out_of_memory_is_bad_input(capsys):
    """A 200000-wide layer needs 160 GB: the user's input, so one line and exit 2, not an internal error."""
    args = ["--sizes", "200000", "--batch-sizes", "2", "--dtypes", "float32", "--repeats", "1"]
    assert run_probe(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("batchtui: error: out of memory on cpu for a 200000x200000 float32 layer")


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


@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_text_with_no_token_is_bad_input(tokenizer_dropping_tildes, command, capsys):
    from batchtui.core.cli_generate import run_generate

    run = {"check": run_check, "generate": run_generate}[command]
    assert run(["hello", "~~~", "--model", tokenizer_dropping_tildes, "--max-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "batchtui: error: text 2: the tokenizer gives no token for it, so there is nothing to compare"
