"""Remedies restore every global flag; sweep and probe give the right shape and valid JSON."""

import json
import os

import pytest
import torch
from conftest import MIXED_TEXTS

from batchtui.core import Settings, compare
from batchtui.core.cli.check import run_check
from batchtui.core.cli.probe import run_probe
from batchtui.core.cli.sweep import run_sweep
from batchtui.core.experiments.remedies import REMEDIES, applied, compare_remedies

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


def _global_flags():
    matmul = torch.backends.cuda.matmul
    return (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_bf16_reduced_precision_reduction,
        matmul.allow_fp16_reduced_precision_reduction,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )


def test_every_flag_is_restored_after_a_run_and_after_an_error():
    before = _global_flags()
    outcomes = compare_remedies(MIXED_TEXTS, Settings(model="tiny", dtype="bfloat16"), list(REMEDIES), compare)
    assert _global_flags() == before
    flag_remedies = [r for r in REMEDIES.values() if r.context is not None and r.needs_module is None]
    with pytest.raises(RuntimeError), applied(flag_remedies):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        raise RuntimeError("a run that fails midway")
    assert _global_flags() == before
    by_name = {o.name: o for o in outcomes}
    assert by_name["none"].applied and by_name["float32"].comparison.config["dtype"] == "float32"
    assert by_name["eager-attention"].comparison.config["attn"] == "eager"
    assert not by_name["tf32-off"].applied and "CUDA-only: no effect on cpu" in by_name["tf32-off"].note
    assert not by_name["batch-invariant"].applied and "does not cover attention" in by_name["batch-invariant"].note
    assert by_name["all"].comparison.config["dtype"] == "float32"


def test_check_with_remedies_prints_before_after_and_json(tmp_path, capsys):
    report = tmp_path / "r.json"
    args = ["--dtype", "bfloat16", "--positions", "arange", "--remedy", "float32", "--json", str(report), *MIXED_TEXTS]
    code = run_check(args)
    out = capsys.readouterr().out
    assert "remedy" in out and "float32" in out
    data = json.loads(report.read_text())
    assert [r["remedy"] for r in data["remedies"]] == ["none", "float32"]
    final = data["remedies"][-1]["summary"]
    assert code == (0 if final["diverged"] == 0 else 1)
    assert run_check(["--remedy", "magic", "x"]) == 2


def test_sweep_shape_and_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    args = ["--dtypes", "bfloat16,float32", "--batch-sizes", "1,3", "--attns", "sdpa,eager", "--padding-sides", "left"]
    code = run_sweep([*args, "--json", str(out), *MIXED_TEXTS])
    cells = json.loads(out.read_text())["cells"]
    assert code == (1 if any(c["diverged"] for c in cells) else 0)  # 1: some cell diverged
    assert len(cells) == 2 * 2 * 2 * 1
    assert {(c["dtype"], c["batch_size"], c["attn"]) for c in cells} == {
        (d, b, a) for d in ("bfloat16", "float32") for b in (1, 3) for a in ("sdpa", "eager")
    }
    for cell in cells:
        assert cell["texts"] == len(MIXED_TEXTS) and cell["error"] is None
        if cell["batch_size"] == 1:
            assert cell["max_abs_diff"] == 0.0 and cell["diverged"] == 0
    captured = capsys.readouterr()
    # The table, then one line that sums it up: how many cells diverge and the worst of them.
    summary = captured.out.strip().splitlines()[-1]
    diverged = [c for c in cells if c["diverged"]]
    assert summary.startswith(f"{len(diverged)} of 8 cells diverge")
    if diverged:
        worst = max(diverged, key=lambda c: c["max_abs_diff"])
        assert f"worst {worst['dtype']} batch {worst['batch_size']} {worst['attn']} left padding" in summary
    # Progress names the attention the model resolved for a cell, never "default".
    assert "default" not in captured.err


def test_sweep_summary_counts_cells_and_names_the_clean_dtypes():
    from batchtui.core.experiments.sweep import SweepCell, sweep_summary

    cells = [
        SweepCell("bfloat16", 1, "sdpa", "left", 2, 0, 0.0, 0),
        SweepCell("bfloat16", 4, "sdpa", "left", 2, 1, 0.25, 1),
        SweepCell("float32", 1, "sdpa", "left", 2, 0, 0.0, 0),
        SweepCell("float32", 4, "sdpa", "left", 2, 0, 1e-6, 0),
        SweepCell("float16", 4, "sdpa", "left", 2, None, None, None, error="no float16 here"),
    ]
    assert sweep_summary(cells) == (
        "1 of 5 cells diverge · worst bfloat16 batch 4 sdpa left padding: max|Δ| 0.25 (1 text, 1 flip)"
        " · float32 allclose in every cell (not bitwise: max|Δ| 1e-06; --bitwise judges every bit) · 1 could not run"
    )
    bitwise = [c for c in cells if c.max_abs_diff != 1e-6]  # float32 the same bits in every cell: nothing to add
    assert sweep_summary(bitwise).endswith(" · float32 allclose in every cell · 1 could not run")


def test_probe_shape_and_json(tmp_path, capsys):
    out = tmp_path / "probe.json"
    args = ["--sizes", "64,128", "--batch-sizes", "2,4,8", "--dtypes", "bfloat16,float32", "--repeats", "2"]
    assert run_probe([*args, "--json", str(out)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("bfloat16 size"))
    assert "N=2 eq/close/runs" in header  # every cell's three numbers are named
    data = json.loads(out.read_text())
    assert len(data["cells"]) == 2 * 3 * 2
    for cell in data["cells"]:
        assert 0 <= cell["bitwise_equal"] <= cell["allclose"] <= cell["repeats"] == 2
        assert (cell["bitwise_equal"] == 2) <= (cell["max_abs_diff"] == 0.0)
    assert run_probe(["--repeats", "0"]) == 2


def test_sweep_exit_code_says_a_cell_could_not_run(capsys):
    args = ["--dtypes", "float32", "--batch-sizes", "1", "--attns", "sdpa,no_such_attention", "--padding-sides", "left"]
    assert run_sweep([*args, "one text"]) == 2
    assert "no_such_attention" in capsys.readouterr().out


def test_batchtui_help_lists_the_subcommands(capsys):
    from batchtui.tui.launcher import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"batchtui {name}" in out for name in ("check", "sweep", "probe", "bench"))
