"""`batchtui rollouts` with the lines' `mask`, `step` and `group` (multi-turn and tool rollouts, a run's steps, GRPO's
groups): a masked token is scored and not counted; the metrics by step and by group are each the definitions' over
their tokens (recomputed here from the records); a faulty field is one line naming it."""

import json

import pytest
from helpers.rollout_files import metrics_by_definition, records_in, sampled_rollouts, write_jsonl

from batchtui.core.cli import main

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

COMPARED = ("kl", "k3_kl", "max_abs_diff", "mean_abs_diff", "chi2_token", "clip_fraction", "ess_token")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """The tiny model's own rollouts, each with a mask (its last third of tokens not the sampler's, every fourth line
    none), a step (line mod 3) and a group (two lines each)."""
    rows = sampled_rollouts("tiny", 12, new_tokens=9)
    for i, row in enumerate(rows):
        n = len(row["completion_ids"])
        if i % 4:
            row["mask"] = [1] * (n - n // 3) + [0] * (n // 3)
        row["step"], row["group"] = i % 3, f"prompt-{i // 2}"
    folder = tmp_path_factory.mktemp("labelled")
    path = write_jsonl(folder / "labelled.jsonl", rows)
    report, records = folder / "r.json", folder / "records.jsonl"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--json", str(report),
                 "--records", str(records), "--quiet", "--batch-tokens", "50"])  # fmt: skip
    assert code in (0, 1)
    return rows, json.loads(report.read_text())["rollouts"], records_in(records)


def _counted(record: dict) -> tuple[list[float], list[float]]:
    mask = record["mask"] or [1] * len(record["trainer_logprobs"])
    keep = [i for i, m in enumerate(mask) if m]
    return [record["trainer_logprobs"][i] for i in keep], [record["sampler_logprobs"][i] for i in keep]


def test_a_masked_token_is_scored_and_not_counted(labelled):
    rows, summary, records = labelled
    masked = sum(r["mask"].count(0) for r in rows if "mask" in r)
    assert masked > 0 and summary["masked_tokens"] == masked
    assert all(len(r["trainer_logprobs"]) == len(r["completion_ids"]) for r in records)  # every token scored
    expected = metrics_by_definition([_counted(r) for r in records])
    assert summary["tokens"] == sum(len(r["completion_ids"]) for r in rows) - masked
    for name in COMPARED:
        assert summary[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15), name


@pytest.mark.parametrize("key", ["step", "group"])
def test_the_metrics_by_step_and_by_group_are_the_definitions_over_their_tokens(labelled, key):
    _, summary, records = labelled
    values = sorted({r[key] for r in records})
    assert [entry[key] for entry in summary[f"by_{key}"]] == values
    for entry in summary[f"by_{key}"]:
        mine = [r for r in records if r[key] == entry[key]]
        expected = metrics_by_definition([_counted(r) for r in mine])
        assert entry["sequences"] == len(mine)
        for name in COMPARED:
            assert entry[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-15), (entry[key], name)


@pytest.mark.parametrize(
    "fields,said",
    [({"mask": [1]}, "mask has 1 values, the completion 2 tokens"),
     ({"mask": [1, 2]}, "mask must be a list of 0 and 1"),
     ({"step": -1}, "step must be a whole number from 0"), ({"step": 1.5}, "step must be a whole number from 0"),
     ({"group": [1]}, "group must be a whole number or a string"), ({"group": "x" * 201}, "group must be")],
)  # fmt: skip
def test_a_faulty_mask_step_or_group_is_one_line_naming_it(tmp_path, capsys, fields, said):
    line = {"prompt_ids": [97, 98], "completion_ids": [99, 100], "logprobs": [-1.5, -0.25], **fields}
    path = write_jsonl(tmp_path / "bad.jsonl", [line])
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"line 1: {said}" in err and len(err.strip().splitlines()) == 1, err
