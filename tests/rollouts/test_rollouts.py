"""`batchtui rollouts`: a sampler's rollouts scored as a trainer does. The trainer's logprobs are this test's own
forward's; every metric, percentile and histogram is recomputed here from the records and the input; with the mode,
rollouts the mode itself sampled score every ratio exactly 1."""

import json
import math

import pytest
import torch
from helpers.rollout_files import (
    METRICS,
    metrics_by_definition,
    own_logprobs,
    records_in,
    sampled_rollouts,
    write_jsonl,
)
from transformers import AutoModelForCausalLM

from batchtui.core import batch_invariant
from batchtui.core.cli import main
from batchtui.core.models.builtin import builtin_path
from batchtui.core.rollouts import deltas as rollout_deltas
from batchtui.core.rollouts.deltas import DeltaSpill

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    rows = sampled_rollouts("tiny", 14, new_tokens=6)
    return rows, write_jsonl(tmp_path_factory.mktemp("rollouts") / "sampled.jsonl", rows)


def _run(path, tmp_path, *extra, name="r"):
    report, records = tmp_path / f"{name}.json", tmp_path / f"{name}.records.jsonl"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--json", str(report),
                 "--records", str(records), "--quiet", *extra])  # fmt: skip
    return code, (json.loads(report.read_text()) if report.exists() else None), records


def _records(path) -> list[dict]:
    return records_in(path)


def test_the_trainer_s_logprobs_and_every_number_are_recomputed_here(sampled, tmp_path):
    rows, path = sampled
    code, report, records_path = _run(path, tmp_path, "--batch-tokens", "60")
    assert code == 1  # transformers' decode and a trainer's forward part in float32 on this model
    summary = report["rollouts"]
    records = _records(records_path)
    assert sorted(r["line"] for r in records) == list(range(1, len(rows) + 1))  # each once
    assert len({r["batch"] for r in records}) > 1  # cut by --batch-tokens
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float32).eval()
    pairs = []
    with torch.no_grad():
        for record in records:
            row = rows[record["line"] - 1]
            assert record["sampler_logprobs"] == row["logprobs"] and record["completion_ids"] == row["completion_ids"]
            own = own_logprobs(model, row)
            assert max(abs(a - b) for a, b in zip(record["trainer_logprobs"], own)) < 1e-4
            pairs.append((record["trainer_logprobs"], record["sampler_logprobs"]))
    expected = metrics_by_definition(pairs)
    assert summary["sequences"] == len(rows) and summary["tokens"] == sum(len(r["logprobs"]) for r in rows)
    for name in METRICS:
        assert summary[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15), name
    disagree = sum(sum(r["top1_disagree"]) for r in records)
    assert summary["top1_disagree"] == disagree
    # percentiles: the nearest rank's |δ|, exactly
    absolute = sorted(abs(t - s) for trainer, sampler in pairs for t, s in zip(trainer, sampler))
    for name, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9)):
        assert summary["abs_diff_percentiles"][name] == absolute[math.ceil(p / 100 * len(absolute)) - 1]
    counts = summary["delta_histogram"]["counts"]
    assert sum(counts) == len(absolute) and len(summary["delta_histogram"]["edges"]) == len(counts) + 1
    # the worst sequence has the largest |Σ δ|, the worst token the largest |δ|
    sums = {r["line"]: math.fsum(t - s for t, s in zip(r["trainer_logprobs"], r["sampler_logprobs"])) for r in records}
    worst = summary["worst_sequences"][0]
    assert abs(worst["log_ratio"]) == max(map(abs, sums.values())) and sums[worst["line"]] == worst["log_ratio"]
    assert abs(summary["worst_tokens"][0]["delta"]) == absolute[-1]


def test_rollouts_the_mode_sampled_score_every_ratio_exactly_one_with_the_mode(tmp_path, capsys):
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float32).eval()
    with batch_invariant(model):
        rows = sampled_rollouts("tiny", 6, new_tokens=5, model=model)
    path = write_jsonl(tmp_path / "mode.jsonl", rows)
    code, report, _ = _run(path, tmp_path, "--invariant", "--batch-tokens", "40")
    out = capsys.readouterr().out
    summary = report["rollouts"]
    assert code == 0 and summary["bitwise"]
    assert summary["ratio_min"] == summary["ratio_max"] == 1.0
    assert all(summary[k] == 0.0 for k in ("max_abs_diff", "kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff"))
    assert "every ratio exactly 1" in out.splitlines()[-1]


@pytest.mark.parametrize("chunk", [7, 1 << 20], ids=["chunks", "in-memory"])
def test_the_percentiles_are_the_nearest_rank_s_value_across_chunks(chunk, monkeypatch):
    monkeypatch.setattr(rollout_deltas, "_CHUNK", chunk)  # many chunks (a value's rank found across them), or one
    generator = torch.Generator().manual_seed(0)
    values = (torch.randn(1000, generator=generator, dtype=torch.float64) * 1e-3).tolist()
    values += [0.0, -0.0, 0.0] + values[:50]  # zeros and ties
    spill = DeltaSpill()
    for start in range(0, len(values), 13):
        spill.add(values[start : start + 13])
    absolute = sorted(abs(v) for v in values)
    for name, p in spill.abs_percentiles((0.01, 50.0, 90.0, 99.9, 100.0)).items():
        rank = max(1, math.ceil(float(name[1:]) / 100 * len(values)))
        assert p == absolute[rank - 1], name
    edges, counts = spill.histogram(min(values), max(values), lambda d: d)
    assert sum(counts) == len(values) and edges[0] == min(values) and edges[-1] == max(values)
    spill.close()


def test_the_plan_holds_every_rollout_once_within_the_batch_tokens_the_same_every_time():
    import random

    from batchtui.core.rollouts.plan import WINDOW, batches
    from batchtui.core.rollouts.rollouts_file import Rollout

    rng = random.Random(0)
    rollouts = [
        Rollout(line, str(line), (1,) * rng.randrange(1, 60), (2,) * rng.randrange(1, 40), (-1.0,), None)
        for line in range(1, 2 * WINDOW + 300)
    ]
    plan = list(batches(rollouts, 256))
    again = list(batches(iter(rollouts), 256))
    assert plan == again and [b.index for b in plan] == list(range(len(plan)))
    lines = [r.line for b in plan for r in b.rollouts]
    assert sorted(lines) == [r.line for r in rollouts]
    for batch in plan:
        rows = batch.rollouts
        padded = len(rows) * (max(len(r.prompt_ids) for r in rows) + max(len(r.completion_ids) for r in rows))
        assert padded <= 256 or len(rows) == 1
    # a window's rollouts stay in it: the plan reads the file a window at a time
    assert {r.line for b in plan[: len(plan) // 4] for r in b.rollouts} <= set(range(1, WINDOW + 1))


def test_a_histogram_s_middle_tick_is_its_centre_value_and_a_token_s_space_is_shown():
    """δ's middle tick at 0 and the ratio's at 1 wherever the range holds them (placed by bin), not the range's
    midpoint; a token's leading space shown as `␣` in the token table, as in the explorer."""
    from batchtui.core.numbers.rollouts_summary import Histogram, ScoredToken
    from batchtui.core.terminal.rollouts_text import histogram_ticks, token_row

    delta = Histogram((-0.3, -0.1, 0.1, 0.3, 0.5), (1, 2, 3, 4))  # midpoint 0.1; 0 halfway into the second bin
    assert histogram_ticks(delta, ratio=False) == ([0.0, 1.5, 4.0], ["-0.3", "0", "0.5"])
    ratio = Histogram((0.5, 0.9, 1.3, 1.7), (1, 1, 1))
    places, words = histogram_ticks(ratio, ratio=True)
    assert places[1] == pytest.approx(1.25) and words == ["0.500000", "1.000000", "1.700000"]
    away = Histogram((2.0, 3.0, 4.0), (1, 1))  # no 1 in range: the middle edge
    assert histogram_ticks(away, ratio=True) == ([0.0, 1.0, 2.0], ["2.000000", "3.000000", "4.000000"])
    row = token_row(ScoredToken(step=0, token_id=7, token=" the", trainer=-17.0, sampler=-0.1))
    assert row[1] == "␣the" and row[2] == "-17.000000"
    assert row[5] == f"{math.exp(-16.9):.7g}" and row[5].endswith("e-08")  # a tiny ratio, not 0.000000


def test_lines_sampled_at_a_temperature_are_scored_at_it_and_two_temperatures_are_refused(sampled, tmp_path, capsys):
    """log_softmax(logits / T), as TRL and verl score a sampler's tokens: each trainer logprob against this test's own
    at T (and far from T = 1's); lines of two temperatures are one line, exit 2, unless --temperature says which."""
    rows, _ = sampled
    hot = write_jsonl(tmp_path / "hot.jsonl", [{**row, "temperature": 0.7} for row in rows[:4]])
    code, report, records_path = _run(hot, tmp_path)
    assert code == 1 and report["config"]["temperature"] == 0.7
    assert "note: scored at temperature 0.7: log_softmax(logits / 0.7)" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float32).eval()
    with torch.no_grad():
        for record in records_in(records_path):
            row = rows[record["line"] - 1]
            at_t, at_1 = own_logprobs(model, row, 0.7), own_logprobs(model, row)
            assert max(abs(a - b) for a, b in zip(record["trainer_logprobs"], at_t)) < 1e-4
            assert max(abs(a - b) for a, b in zip(record["trainer_logprobs"], at_1)) > 1e-3
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{**rows[0], "temperature": 0.7}, rows[1]])
    assert main(["rollouts", str(mixed), "--model", "tiny", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "sampled at other temperatures (0.7 at line 1, 1 at line 2)" in err and err.count("\n") == 1, err
    assert main(["rollouts", str(mixed), "--model", "tiny", "--quiet", "--temperature", "1"]) in (0, 1)
    assert "note: scored at temperature" not in capsys.readouterr().out


def test_lines_sampled_from_a_truncated_distribution_are_said_and_two_samplers_refused(sampled, tmp_path, capsys):
    """top_p / top_k in the lines (`endpoint --save-rollouts` writes them): the report's config holds them and a note
    says the trainer scores the whole distribution; lines of two settings are one line, exit 2."""
    rows, _ = sampled
    cut = write_jsonl(tmp_path / "cut.jsonl", [{**row, "top_p": 0.9, "top_k": 5} for row in rows[:3]])
    code, report, _ = _run(cut, tmp_path)
    assert code in (0, 1) and (report["config"]["top_p"], report["config"]["top_k"]) == (0.9, 5)
    out = capsys.readouterr().out
    assert "note: sampled with top-p 0.9 and top-k 5: the sampler drew from the truncated distribution" in out
    whole = write_jsonl(tmp_path / "whole.jsonl", [{**row, "top_p": 1.0, "top_k": 0} for row in rows[:2]])
    assert _run(whole, tmp_path, name="whole")[0] in (0, 1) and "note: sampled with" not in capsys.readouterr().out
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [rows[0], {**rows[1], "top_p": 0.9}])
    assert main(["rollouts", str(mixed), "--model", "tiny", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "sampled otherwise (top_p 1 top_k 0 at line 1, top_p 0.9 top_k 0 at line 2)" in err, err
    assert err.count("\n") == 1


def test_with_the_mode_the_report_says_what_it_removed_as_two_plain_runs_give_it(sampled, tmp_path, capsys):
    """The trainer's own batch noise the mode removes: the first batch's tokens that move between their batch and
    alone, recomputed here from a plain run in the plan's batches and one with every sequence alone (a batch of one
    per sequence: --batch-tokens 1). How many move is this machine's kernels' to say; in the mode, none."""
    rows, path = sampled
    _, _, batched = _run(path, tmp_path, "--batch-tokens", "60", name="batched")
    _, _, alone = _run(path, tmp_path, "--batch-tokens", "1", name="alone")
    capsys.readouterr()
    _, report, _ = _run(path, tmp_path, "--batch-tokens", "60", "--invariant", name="mode")
    out = capsys.readouterr().out
    noise = report["rollouts"]["batch_noise"]
    together = _records(batched)
    on_its_own = {r["line"]: r["trainer_logprobs"] for r in _records(alone)}
    first = [r for r in together if r["batch"] == 0][:16]
    assert noise["lines"] == [r["line"] for r in first]
    moves = [abs(a - b) for r in first for a, b in zip(r["trainer_logprobs"], on_its_own[r["line"]])]
    assert noise["tokens"] == len(moves) and noise["moved"] == sum(m > 0 for m in moves)
    assert noise["max_abs_diff"] == max(moves) and noise["moved_in_mode"] == 0
    assert "the batch-invariant mode removed the trainer's own batch noise" in out
    _, plain, _ = _run(path, tmp_path, name="plain")
    assert plain["rollouts"]["batch_noise"] is None  # said only with --invariant
