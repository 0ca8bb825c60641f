"""Reports that travel: the environment in every report, repro packs (`--repro`, `check --from`) and `diff`."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import shutil

import pytest
import torch

from batchtui.core.cli import main
from batchtui.core.reports.environment import model_identity, texts_hash

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

TEXTS = ["Hello there", "The quick brown fox jumps over the lazy dog.", "xyz"]
TINY = ["--model", "tiny", "--dtype", "bfloat16"]


def _report(tmp_path, command: list[str], name: str = "r.json") -> dict:
    path = tmp_path / name
    assert main([*command, "--json", str(path)]) in (0, 1)
    return json.loads(path.read_text())


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_report_carries_a_true_environment(tmp_path, tiny_path):
    import transformers

    reports = {
        "check": _report(tmp_path, ["check", *TINY, *TEXTS], "check.json"),
        "generate": _report(tmp_path, ["generate", *TINY, "--max-new-tokens", "2", *TEXTS], "generate.json"),
        "sweep": _report(
            tmp_path, ["sweep", "--model", "tiny", "--dtypes", "float32", "--batch-sizes", "2", *TEXTS], "sweep.json"
        ),  # fmt: skip
    }
    for kind, report in reports.items():
        env = report["environment"]
        assert env["versions"]["torch"] == torch.__version__, kind
        assert env["versions"]["transformers"] == transformers.__version__
        assert env["versions"]["batchtui"] == importlib.metadata.version("batchtui")
        assert env["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
        assert env["threads"] == torch.get_num_threads()
        assert env["gpus"] == [] and env["versions"]["cuda"] == torch.version.cuda
        assert env["numerics"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
        assert env["numerics"]["invariant_mode"] is False
        assert env["texts_sha256"] == texts_hash(TEXTS)
        identity = env["identity"]
        assert identity["config_sha256"] == _sha256(tiny_path / "config.json")
        weights = hashlib.sha256(f"model.safetensors:{_sha256(tiny_path / 'model.safetensors')}\n".encode())
        assert identity["weights_sha256"] == weights.hexdigest()
        assert len(env["fingerprint"]) == 12
    assert len({r["environment"]["fingerprint"] for r in reports.values()}) == 1  # the same setup, the same print


def test_the_variables_that_change_numerics_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = _report(tmp_path, ["check", *TINY, "a"])["environment"]
    assert env["variables"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_hashing_a_model_twice_reads_its_weights_once(tmp_path, tiny_path, monkeypatch):
    import builtins

    from batchtui.core.reports import environment

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(tiny_path, model)
    weights = model / "model.safetensors"
    reads = []

    def counting_open(path, *args, **kwargs):
        reads.append(str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(environment, "open", counting_open, raising=False)
    first = model_identity(str(model))
    second = model_identity(str(model))
    assert first == second and reads.count(str(weights)) == 1
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")  # a changed file is hashed anew
    assert model_identity(str(model))["weights_sha256"] != first["weights_sha256"]
    assert reads.count(str(weights)) == 2


@pytest.mark.parametrize("command", ["check", "generate"])
def test_a_pack_made_here_runs_again_here_bitwise(tmp_path, capsys, command):
    pack = tmp_path / "pack"
    extra = ["--max-new-tokens", "3"] if command == "generate" else []
    assert main([command, *TINY, *extra, *TEXTS, "--repro", str(pack)]) in (0, 1)
    assert sorted(p.name for p in pack.iterdir()) == ["command.json", "logits.safetensors", "report.json", "texts.json"]
    assert json.loads((pack / "texts.json").read_text())["texts"] == TEXTS
    assert json.loads((pack / "command.json").read_text())["command"][-2:] == ["--repro", str(pack)]
    capsys.readouterr()
    result = tmp_path / "from.json"
    assert main(["check", "--from", str(pack), "--json", str(result)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model: tiny (the pack's)\nenvironment: the same as the pack's") and "3 of 3 texts" in out
    data = json.loads(result.read_text())
    assert all(t["single"]["bitwise_equal"] and t["batched"]["bitwise_equal"] for t in data["texts"])


def test_one_ulp_in_one_position_is_found_at_that_text_and_position(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    pack = tmp_path / "pack"
    assert main(["check", *TINY, *TEXTS, "--repro", str(pack)]) in (0, 1)
    tensors = load_file(str(pack / "logits.safetensors"))
    altered = tensors["single/1"].clone()
    bits = altered.view(torch.int16)
    bits[4, 7] += 1  # the next bfloat16 after the logit at position 4, token 7
    tensors["single/1"] = altered
    save_file(tensors, str(pack / "logits.safetensors"))
    result = tmp_path / "from.json"
    assert main(["check", "--from", str(pack), "--json", str(result)]) == 1
    texts = json.loads(result.read_text())["texts"]
    assert texts[1]["single"]["bitwise_equal"] is False and texts[1]["single"]["first_position"] == 4
    assert texts[1]["single"]["max_abs_diff"] > 0 and texts[1]["batched"]["bitwise_equal"] is True
    assert all(t["single"]["bitwise_equal"] for i, t in enumerate(texts) if i != 1)
    assert "2 of 3 texts reproduce" in capsys.readouterr().out


def test_a_pack_changed_on_another_machine_lists_the_environment_first(tmp_path, capsys):
    pack = tmp_path / "pack"
    assert main(["check", *TINY, "a", "--repro", str(pack)]) in (0, 1)
    report = json.loads((pack / "report.json").read_text())
    report["environment"]["cpu"]["capability"] = "another CPU's"  # as another machine would have written it
    report["environment"]["versions"]["torch"] = "2.0.0"
    (pack / "report.json").write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["check", "--from", str(pack)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["model: tiny (the pack's)", "environment: 2 differences (the pack's → here)"]
    assert lines[2].startswith("  cpu.capability: another CPU's → ")
    assert lines[3].startswith("  versions.torch: 2.0.0 → ")


def test_a_pack_never_writes_over_a_folder(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    assert main(["check", *TINY, "a", "--repro", str(taken)]) == 2
    assert "not an empty folder" in capsys.readouterr().err and (taken / "mine.txt").read_text() == "keep"


def test_diff_of_two_dtypes_exits_1_naming_the_dtype(tmp_path, capsys):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    assert main(["check", "--model", "tiny", "--dtype", "bfloat16", *TEXTS, "--json", str(a)]) in (0, 1)
    assert main(["check", "--model", "tiny", "--dtype", "float64", *TEXTS, "--json", str(b)]) in (0, 1)
    capsys.readouterr()
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "  dtype: bfloat16 → float64" in out and "settings differ (dtype)" in out
    assert "dtype_requested" not in out  # the dtype asked for is said only where it alone differs
    assert main(["diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("the results agree: every verdict of 3 texts")


def test_diff_counts_texts_by_their_verdict_and_says_how_far_the_rest_moved(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["check", "--model", "tiny", "--dtype", "float64", *TEXTS, "--json", str(a)]) == 0
    report = json.loads(a.read_text())
    report["texts"][0]["max_abs_diff"] = 2e-6  # still allclose: the verdict holds
    b.write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["diff", str(a), str(b)]) == 0
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith(
            "the results agree: every verdict of 3 texts; 1 text keeps the verdict with another max|Δ|, flips or split "
            "(max|Δ| moved by up to 2.00e-06)"
        )
    )
    report["texts"][1] |= {"allclose": False, "max_abs_diff": 0.5}
    b.write_text(json.dumps(report))
    result = tmp_path / "diff.json"
    assert main(["diff", str(a), str(b), "--json", str(result)]) == 1
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith(
            "the results differ: 1 of 3 texts change verdict; 1 more text keeps the verdict with another max|Δ|, flips "
            "or split (max|Δ| moved by up to 2.00e-06)"
        )
    )
    texts = json.loads(result.read_text())["texts"]
    assert [(t["agrees"], t["verdict_changed"], t["measures_moved"]) for t in texts] == [
        (True, False, True), (False, True, True), (True, False, False)
    ]  # fmt: skip


def test_diff_of_two_packs_compares_their_logits(tmp_path, capsys):
    for name in ("a", "b"):
        assert main(["check", *TINY, *TEXTS, "--repro", str(tmp_path / name)]) in (0, 1)
    result = tmp_path / "diff.json"
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(result)]) == 0
    data = json.loads(result.read_text())
    assert data["agrees"] and all(t["logits_alone"]["bitwise_equal"] for t in data["texts"])


def test_diff_of_other_texts_or_another_model_exits_2(tmp_path, capsys, tiny_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    assert main(["check", *TINY, "one", "two", "--json", str(a)]) in (0, 1)
    assert main(["check", *TINY, "one", "three", "--json", str(b)]) in (0, 1)
    assert main(["check", "--model", "qwen2-english-4m", "one", "two", "--json", str(c)]) in (0, 1)
    capsys.readouterr()
    assert main(["diff", str(a), str(b)]) == 2
    assert "the texts differ" in capsys.readouterr().err
    assert main(["diff", str(a), str(c)]) == 2
    assert "the models differ" in capsys.readouterr().err


async def test_the_app_writes_a_pack_from_ctrl_s_and_shows_the_fingerprint_on_i(tmp_path):
    from helpers.tui_helpers import make_app, settle, wait_for
    from textual.widgets import Input

    from batchtui.core.reports.environment import environment
    from batchtui.tui.widgets.status_line import StatusLine

    app = make_app(texts=TEXTS, tmp_path=tmp_path)
    pack = tmp_path / "pack"
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        status = app.query_one(StatusLine)
        await pilot.press("I")
        await wait_for(pilot, lambda: "fingerprint " in status.full_text() and "hashing" not in status.full_text(),
                       "the fingerprint")  # fmt: skip
        # Asked on a fresh thread, as the app's runs are: torch's thread count is a per-thread setting once a thread
        # has run kernels, and this one may have run them before another test's command changed the count.
        fresh = asyncio.to_thread(environment, app.state.settings.model, TEXTS, invariant=False)
        expected = (await fresh)["fingerprint"]
        assert f"fingerprint {expected} · torch {torch.__version__}" in status.full_text()
        await pilot.press("ctrl+s")
        app.screen.query_one(Input).value = str(pack)  # not a .json: a folder for a pack
        await pilot.press("enter")
        await wait_for(pilot, lambda: (pack / "report.json").exists(), "the pack")
        await wait_for(pilot, lambda: any("repro pack written" in n.message for n in app._notifications), "done")
        on_screen = app.state.comparison
    report = json.loads((pack / "report.json").read_text())
    assert report["summary"]["texts"] == len(TEXTS) and report["config"]["dtype"] == "bfloat16"
    assert report["summary"]["max_abs_diff"] == on_screen.summary.max_abs_diff  # the same run, again
    command = json.loads((pack / "command.json").read_text())
    assert command["command"][:2] == ["batchtui", "check"] and "--positions" in command["command"]
    from batchtui.core.reports.pack_reader import read_pack

    kept = read_pack(str(pack))
    assert sorted(kept.single) == [0, 1, 2] and kept.single[1].shape[0] == len(on_screen.texts[1].token_ids)


def test_a_pack_s_files_share_one_mode(tmp_path):
    """The logits file is written like the others (the umask's mode), not safetensors' private 0600."""
    import stat as stat_module

    from batchtui.core.cli import main

    pack = tmp_path / "pack"
    assert main(["check", "--model", "tiny", "--dtype", "float32", "ab", "--repro", str(pack)]) in (0, 1)
    modes = {p.name: stat_module.S_IMODE(p.stat().st_mode) for p in pack.iterdir()}
    assert len(set(modes.values())) == 1, modes
