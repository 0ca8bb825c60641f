"""A rollouts file is someone else's: each fault is one line on stderr naming the line and the fault, exit 2, before
any work (no records file made); with --skip-bad the faulty lines are skipped and counted in the report."""

import json

import pytest
from helpers.rollout_files import records_in

from batchtui.core.cli import main

GOOD = {"prompt_ids": [97, 98], "completion_ids": [99, 100], "logprobs": [-1.5, -0.25]}
VOCAB, CONTEXT = 512, 8192  # the built-in tiny model's

FAULTS = [
    ("{not json", "line 2: not a JSON object"),
    ("[1, 2]", "line 2: not a JSON object"),
    (json.dumps({**GOOD, "completion_ids": [99, VOCAB]}),
     f"line 2: completion_ids holds {VOCAB}, outside the model's vocabulary of {VOCAB}"),
    (json.dumps({**GOOD, "prompt_ids": [-1]}), "line 2: prompt_ids holds -1, outside the model's vocabulary"),
    (json.dumps({**GOOD, "prompt_ids": [1.5]}), "line 2: prompt_ids must be a list of whole numbers"),
    (json.dumps({**GOOD, "logprobs": [-1.0]}), "line 2: logprobs has 1 values, the completion 2 tokens"),
    ('{"prompt_ids": [97], "completion_ids": [99], "logprobs": [NaN]}',
     "line 2: logprob 0 is nan: a logprob is a finite number at most 0"),
    (json.dumps({**GOOD, "logprobs": [-1.0, 0.5]}), "line 2: logprob 1 is 0.5: a logprob is a finite number at most 0"),
    (json.dumps({**GOOD, "logprobs": ["x", -1]}), "line 2: logprobs must be a list of numbers"),
    (json.dumps({**GOOD, "prompt_ids": [97] * CONTEXT}),
     f"line 2: {CONTEXT} prompt + 2 completion tokens is more than the model's context of {CONTEXT}"),
    (json.dumps({"completion_ids": [99], "logprobs": [-1.0]}), "line 2: no prompt_ids (nor a prompt string)"),
    (json.dumps({**GOOD, "completion_ids": [], "logprobs": []}), "line 2: the completion has no tokens"),
    (json.dumps({**GOOD, "prompt_ids": []}), "line 2: the prompt has no tokens"),
    (json.dumps({**GOOD, "top1_ids": [1]}), "line 2: top1_ids has 1 ids, the completion 2 tokens"),
    (json.dumps({**GOOD, "prompt": 5, "prompt_ids": None}), "line 2: prompt must be a string"),
    (b"\xff\xfe".decode("latin-1"), "line 2: not a JSON object"),
    (json.dumps({**GOOD, "top_p": 0}), "line 2: top_p must be a number above 0 and at most 1, not 0"),
    (json.dumps({**GOOD, "top_p": "0.9"}), "line 2: top_p must be a number above 0 and at most 1, not 0.9"),
    (json.dumps({**GOOD, "top_k": -1}), "line 2: top_k must be 0 (off) or a count of tokens, not -1"),
    (json.dumps({**GOOD, "top_k": 2.5}), "line 2: top_k must be 0 (off) or a count of tokens, not 2.5"),
    ('{"prompt_ids": [97], "completion_ids": [99], "logprobs": [-1' + "0" * 400 + "]}",
     "line 2: logprob 0 is -10000000000... (402 digits): a logprob is a finite number at most 0"),
]  # fmt: skip


def _file(tmp_path, bad: str):
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps(GOOD) + "\n" + bad + "\n" + json.dumps(GOOD) + "\n", encoding="utf-8", errors="surrogateescape"
    )
    return path


@pytest.mark.parametrize(("bad", "said"), FAULTS)
def test_a_faulty_line_is_one_line_naming_it_and_exit_2_before_any_work(bad, said, tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    code = main(["rollouts", str(_file(tmp_path, bad)), "--model", "tiny", "--records", str(records), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not records.exists()


def test_with_skip_bad_faulty_lines_are_skipped_and_counted(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(GOOD), "{", json.dumps({**GOOD, "logprobs": [0.5, -1]}), "", json.dumps(GOOD)]
    path.write_text("\n".join(lines) + "\n")
    report = tmp_path / "r.json"
    assert main(["rollouts", str(path), "--model", "tiny", "--skip-bad", "--json", str(report), "--quiet"]) in (0, 1)
    summary = json.loads(report.read_text())["rollouts"]
    assert summary["sequences"] == 2 and summary["skipped"] == 2
    assert summary["faults"] == ["line 2: not a JSON object",
                                 "line 3: logprob 0 is 0.5: a logprob is a finite number at most 0"]  # fmt: skip
    assert "2 faulty lines skipped" in capsys.readouterr().out


def test_strings_are_tokenized_by_the_model_s_tokenizer_and_other_keys_ignored(tmp_path):
    path = tmp_path / "in.jsonl"
    # the tiny model's tokenizer: one byte a token; the prompt with its special tokens (none here)
    path.write_text(
        json.dumps({"prompt": "ab", "completion": "cd", "logprobs": [-1.5, -0.25], "extra": {"x": 1}}) + "\n"
    )
    report, records = tmp_path / "r.json", tmp_path / "rec.jsonl"
    assert (
        main(["rollouts", str(path), "--model", "tiny", "--json", str(report), "--records", str(records), "--quiet"])
        == 1
    )
    (record,) = records_in(records)
    assert record["completion_ids"] == [99, 100] and record["sampler_logprobs"] == [-1.5, -0.25]


def test_an_empty_file_a_missing_one_and_resume_without_records_are_refused(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["rollouts", str(empty), "--model", "tiny", "--quiet"]) == 2
    assert "holds no rollouts" in capsys.readouterr().err
    assert main(["rollouts", str(tmp_path / "none.jsonl"), "--model", "tiny", "--quiet"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["rollouts", str(empty), "--model", "tiny", "--resume"]) == 2
    assert "--resume goes on from a records file: give it with --records" in capsys.readouterr().err


def test_a_ratio_past_the_largest_float_is_infinite_and_every_view_draws(tmp_path, capsys):
    """A sampler logprob of -1000 (finite, at most 0: valid) against the trainer's few nats: exp(δ) overflows a
    float. The ratio is inf, the metrics that hold it too, the histograms still draw and the report is JSON."""
    path = tmp_path / "in.jsonl"
    rows = [{"prompt_ids": [104, 105], "completion_ids": [106, 107], "logprobs": [-1000.0, -1.0]},
            {"prompt_ids": [104, 105], "completion_ids": [106, 108], "logprobs": [-5.0, -1.0]}]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = tmp_path / "r.json"
    assert main(["rollouts", str(path), "--model", "tiny", "--json", str(report), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "ratio = exp(δ): tokens per bin" in out and "δ = lt − lr: tokens per bin" in out
    metrics = json.loads(report.read_text())["rollouts"]
    assert metrics["ratio_max"] is None and metrics["chi2_token"] is None and 990 < metrics["max_abs_diff"] < 1000


def test_a_folder_as_the_rollouts_or_prompts_file_is_one_line_and_exit_2(tmp_path, capsys):
    folder = tmp_path / "a-folder.jsonl"
    folder.mkdir()
    assert main(["rollouts", str(folder), "--model", "tiny", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a regular file" in err and "Traceback" not in err, err
    out = tmp_path / "out.jsonl"
    assert main(["endpoint", "--url", "http://127.0.0.1:9/v1", "--texts-file", str(folder), "--save-rollouts",
                 str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a regular file" in err and not out.exists(), err


def test_logprobs_of_minus_1e308_score_to_an_infinite_ratio_not_a_crash(tmp_path, capsys):
    """Their δ sum past the largest float: the sequence's log ratio is infinite, every table and the report draw."""
    bad = {**GOOD, "logprobs": [-1e308, -1e308]}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(bad) + "\n" + json.dumps(GOOD) + "\n")
    report = tmp_path / "r.json"
    assert main(["rollouts", str(path), "--model", "tiny", "--quiet", "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "ratio " in out and "-inf" in out or "inf" in out
    assert max(len(line) for line in out.splitlines()) < 200  # (no logprob written out in 309 digits)
    data = json.loads(report.read_text())["rollouts"]
    assert data["ratio_max"] is None  # infinite: written as null


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    report = tmp_path / "r.json"
    assert main(["rollouts", str(path), "--model", "tiny", "--quiet", "--json", str(report)]) in (0, 1)
    assert json.loads(report.read_text())["rollouts"]["sequences"] == 1
