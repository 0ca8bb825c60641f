"""A rollouts run opened again without scoring (`batchtui --rollouts FILE` on a `--json` report or a `--records` file):
a report reads back to the summary it was written from (written again, the same JSON); a records file gives the
scoring run's summary; what is not a report is one line naming the field, whatever it holds."""

from __future__ import annotations

import json

import pytest
from helpers.rollout_files import sampled_rollouts, write_jsonl

from batchtui.core.cli import main
from batchtui.core.errors import InputError
from batchtui.core.reports.rollouts_json import rollouts_json
from batchtui.core.rollouts.saved import saved_rollouts


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """(rollouts, report, records) of one scoring run of the tiny model's own rollouts, with steps and groups."""
    folder = tmp_path_factory.mktemp("saved")
    rows = sampled_rollouts("tiny", 9, new_tokens=5)
    for i, row in enumerate(rows):
        row.update(step=i % 2, group=f"g{i % 3}")
    path = write_jsonl(folder / "in.jsonl", rows)
    report, records = folder / "report.json", folder / "records.jsonl"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--invariant", "--json", str(report),
                 "--records", str(records), "--quiet"])  # fmt: skip
    assert code in (0, 1)
    return path, report, records


def test_a_report_reads_back_to_the_summary_it_was_written_from(scored):
    _, report, _ = scored
    saved = saved_rollouts(str(report))
    assert saved is not None and saved.kind == "report"
    written = json.loads(report.read_text())
    again = rollouts_json(saved.summary())
    assert again["rollouts"] == written["rollouts"]  # every metric, band, histogram, token, the mode's note
    assert again["config"]["model"] == "tiny" and written["rollouts"]["batch_noise"] is not None


def test_a_records_file_gives_the_scoring_run_s_summary(scored):
    path, report, records = scored
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [json.loads(line) for line in records.read_text().splitlines()[1:]]
    assert [r["top1_ids"] for r in kept] == [lines[r["line"] - 1]["top1_ids"] for r in kept]  # the sampler's top-1s
    saved = saved_rollouts(str(records))
    assert saved is not None and saved.kind == "records" and saved.run["model"] == "tiny"
    summary = rollouts_json(saved.summary())["rollouts"]
    written = json.loads(report.read_text())["rollouts"]
    for name in ("sequences", "tokens", "max_abs_diff", "kl", "chi2_seq", "delta_histogram", "worst_sequences",
                 "worst_tokens", "by_step", "by_group", "abs_diff_percentiles"):  # fmt: skip
        assert summary[name] == written[name], name


def test_rollouts_to_score_are_neither(scored):
    path, _, _ = scored
    assert saved_rollouts(str(path)) is None


def _damaged(report, tmp_path, change) -> str:
    data = json.loads(report.read_text())
    change(data["rollouts"])
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(data, indent=1))
    return str(damaged)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r.update(kl="0.1"), "its kl is not"),
        (lambda r: r.update(sequences=True), "its sequences is not"),
        (lambda r: r["worst_sequences"][0]["steps"][0].update(token=["x"]), "its token is not"),
        (lambda r: r["delta_histogram"].update(counts=[1, 2]), "its delta_histogram is not"),
        (lambda r: r.update(worst_tokens=[{"line": -1}]), "its worst_tokens is not"),
        (lambda r: r.update(faults=[None]), "its faults is not"),
        (lambda r: r.pop("by_position"), "its by_position is not"),
    ],
)  # fmt: skip
def test_a_report_that_is_not_one_is_a_line_naming_the_field(scored, tmp_path, change, said):
    _, report, _ = scored
    saved = saved_rollouts(_damaged(report, tmp_path, change))
    assert saved is not None
    with pytest.raises(InputError, match=said):
        saved.summary()


def test_not_json_and_a_report_past_the_size_limit_are_refused(tmp_path, monkeypatch):
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  \"rollouts\": [1, 2")
    with pytest.raises(InputError, match="is not JSON"):
        saved_rollouts(str(broken)).summary()
    from batchtui.core.rollouts import saved_report

    monkeypatch.setattr(saved_report, "MAX_REPORT_BYTES", 8)
    with pytest.raises(InputError, match="over the"):
        saved_rollouts(str(broken)).summary()
