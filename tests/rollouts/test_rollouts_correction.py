"""`batchtui rollouts` against a trainer's rollout correction: the clip range, the truncation cap and floor set on the
command line change the fractions as docs/metrics.md defines them (recomputed here from the records); |δ| by the
token's step and by the trainer's entropy; `--max-kl` as a CI gate; bad settings refused in one line."""

import json
import math

import pytest
import torch
from helpers.rollout_files import METRICS, metrics_by_definition, records_in, sampled_rollouts, write_jsonl
from transformers import AutoModelForCausalLM

from batchtui.core.cli import main
from batchtui.core.models.builtin import builtin_path

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A file of the tiny model's own rollouts, scored once with the defaults: (rows, path, the records)."""
    folder = tmp_path_factory.mktemp("correction")
    rows = sampled_rollouts("tiny", 10, new_tokens=20)
    path = write_jsonl(folder / "sampled.jsonl", rows)
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--records",
                 str(folder / "records.jsonl"), "--quiet", "--json", str(folder / "r.json")])  # fmt: skip
    assert code in (0, 1)
    return rows, path, records_in(folder / "records.jsonl")


def _run(path, tmp_path, *extra) -> tuple[int, dict | None]:
    report = tmp_path / "r.json"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--json", str(report), "--quiet",
                 *extra])  # fmt: skip
    return code, (json.loads(report.read_text()) if report.exists() else None)


def test_the_correction_s_settings_change_the_fractions_as_defined(scored, tmp_path):
    _, path, records = scored
    pairs = [(r["trainer_logprobs"], r["sampler_logprobs"]) for r in records]
    ratios = sorted(math.exp(t - s) for trainer, sampler in pairs for t, s in zip(trainer, sampler))
    # settings that cut through this file's ratios (its mismatch is float32 rounding: ratios within 1e-5 of 1)
    eps = abs(ratios[len(ratios) // 2] - 1) or 1e-9
    cap, floor = ratios[3 * len(ratios) // 4], ratios[len(ratios) // 4]
    code, report = _run(path, tmp_path, "--clip-eps", repr(eps), "--tis-cap", repr(max(cap, 1.0)),
                        "--tis-floor", repr(min(floor, 1.0)))  # fmt: skip
    summary = report["rollouts"]
    expected = metrics_by_definition(pairs, eps, max(cap, 1.0), min(floor, 1.0))
    for name in (*METRICS, "tis_low_fraction"):
        assert summary[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15), name
    assert 0 < summary["clip_fraction"] < 1  # the settings took: the defaults count none of these ratios
    config = report["config"]
    assert (config["clip_eps"], config["tis_cap"], config["tis_floor"]) == (eps, max(cap, 1.0), min(floor, 1.0))


def test_delta_by_step_and_by_the_trainer_s_entropy_recomputed_from_the_records(scored, tmp_path):
    rows, path, records = scored
    _, report = _run(path, tmp_path)
    summary = report["rollouts"]
    tokens = [  # (step, |δ|, entropy) of every token
        (step, abs(t - s), e)
        for r in records
        for step, (t, s, e) in enumerate(zip(r["trainer_logprobs"], r["sampler_logprobs"], r["trainer_entropy"]))
    ]
    for key, where in (("by_position", 0), ("by_entropy", 2)):
        bands = summary[key]
        assert sum(b["tokens"] for b in bands) == len(tokens), key
        for band in bands:
            high = math.inf if band["high"] is None else band["high"]
            inside = [t[1] for t in tokens if band["low"] <= t[where] < high]
            assert band["tokens"] == len(inside) and band["max_abs_diff"] == max(inside), (key, band)
            assert band["mean_abs_diff"] == pytest.approx(math.fsum(inside) / len(inside), rel=1e-12)
    # the entropy is the trainer's distribution's at the token: this test's own forward of one sequence
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float32).eval()
    record = records[0]
    row = rows[record["line"] - 1]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row["prompt_ids"] + row["completion_ids"]])).logits[0].float()
    p = len(row["prompt_ids"])
    own = logits[p - 1 : -1].log_softmax(-1)
    entropy = -(own.exp() * own).sum(-1)
    assert record["trainer_entropy"] == pytest.approx(entropy.tolist(), abs=1e-4)


def test_max_kl_is_a_gate_exit_0_within_1_over(scored, tmp_path, capsys):
    """Lines whose sampler logprobs sit 0.05 above the trainer's: kl = mean(lr − lt) = 0.05, within 0.1, over 0.01."""
    rows, _, records = scored
    lifted = []
    for record in records:
        row = dict(rows[record["line"] - 1])
        row["logprobs"] = [min(t + 0.05, 0.0) for t in record["trainer_logprobs"]]
        lifted.append(row)
    path = write_jsonl(tmp_path / "lifted.jsonl", lifted)
    code, report = _run(path, tmp_path, "--max-kl", "0.1")
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert code == 0 and report["rollouts"]["kl_within"] is True and report["rollouts"]["max_kl"] == 0.1
    assert 0.04 < report["rollouts"]["kl"] <= 0.05 and "kl within --max-kl 0.1" in verdict
    code, report = _run(path, tmp_path, "--max-kl", "0.01")
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert code == 1 and report["rollouts"]["kl_within"] is False and "kl OVER --max-kl 0.01" in verdict
    code, report = _run(path, tmp_path)  # without the gate: not bitwise, exit 1, no gate said
    assert code == 1 and report["rollouts"]["kl_within"] is None and "max-kl" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "option,value,said",
    [("--clip-eps", "0", "--clip-eps must be above 0"), ("--tis-cap", "0.5", "--tis-cap must be at least 1"),
     ("--tis-floor", "2", "--tis-floor must be at least 0 and at most 1"), ("--max-kl", "-1", "--max-kl must be"),
     ("--max-kl", "nan", "--max-kl must be"), ("--clip-eps", "inf", "--clip-eps must be")],
)  # fmt: skip
def test_bad_correction_settings_are_one_line_exit_2(scored, tmp_path, capsys, option, value, said):
    _, path, _ = scored
    code, report = _run(path, tmp_path, option, value)
    err = capsys.readouterr().err
    assert code == 2 and report is None and said in err and len(err.strip().splitlines()) == 1, err


def test_records_of_an_older_format_are_refused_by_resume_naming_it(scored, tmp_path, capsys):
    _, path, _ = scored
    records = tmp_path / "old.records.jsonl"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--records", str(records),
                 "--quiet"])  # fmt: skip
    lines = records.read_text().splitlines()
    header = json.loads(lines[0])
    del header["run"]["records_format"]  # as a run before each token's entropy was kept wrote it
    records.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    capsys.readouterr()
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--records", str(records),
                 "--resume", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "its records_format is null, this run's 4" in err, err
    assert records.read_text().splitlines()[1:] == lines[1:]  # nothing lost
