"""`rollouts --layout packed`: sequences one after another in rows, positions from 0 each, no padding between them (as
verl and OpenRLHF train). The rows are what the layout says; each sequence's logprobs are its own (against each
sequence alone in float64, computed here); in the mode they are the GRPO layout's bits; a model whose masks do not
tell packed sequences apart, and a layout TRL's call does not use, are one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.architectures import build
from helpers.rollout_files import records_in, sampled_rollouts, write_jsonl
from transformers import AutoModelForCausalLM

from batchtui.core.cli import main
from batchtui.core.models.builtin import builtin_path
from batchtui.core.run.packed_layout import packed_rows


def test_the_rows_hold_the_sequences_in_order_within_the_width_positions_from_0_each():
    prompts, completions = [[1, 2], [3], [4, 5, 6], [7]], [[8, 9], [10, 11], [12], [13, 14, 15, 16, 17, 18, 19]]
    rows = packed_rows(prompts, completions, pad_id=0, width=8, device="cpu")
    # 4 + 3 tokens fit in a row of 8; 4 more do not; the last, 8, fills one
    assert rows.places == ((0, 0), (0, 4), (1, 0), (2, 0))
    assert rows.ids.tolist() == [
        [1, 2, 8, 9, 3, 10, 11, 0],
        [4, 5, 6, 12, 0, 0, 0, 0],
        [7, 13, 14, 15, 16, 17, 18, 19],
    ]
    assert rows.positions.tolist() == [
        [0, 1, 2, 3, 0, 1, 2, 0],  # the padding a sequence of its own, from 0
        [0, 1, 2, 3, 0, 1, 2, 3],
        [0, 1, 2, 3, 4, 5, 6, 7],
    ]


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("packed") / "sampled.jsonl", sampled_rollouts("tiny", 10, new_tokens=7))


def _records(path, tmp_path, *extra) -> list[dict]:
    records = tmp_path / f"records{len(list(tmp_path.iterdir()))}.jsonl"
    code = main(["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--records", str(records), "--quiet",
                 *extra])  # fmt: skip
    assert code in (0, 1)
    return records_in(records)


def test_each_packed_sequence_s_logprobs_are_its_own(rollouts_file, tmp_path):
    """Against each sequence alone in float64 (no batch, no packing): within float32's rounding, where attending to
    the sequences before it in its row would move them by tenths."""
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float64)
    lines = [json.loads(line) for line in rollouts_file.read_text().splitlines()]
    records = _records(rollouts_file, tmp_path, "--layout", "packed")
    assert len(records) == len(lines) == 10
    for record in records:
        line = lines[record["line"] - 1]
        ids = torch.tensor([line["prompt_ids"] + line["completion_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        p, n = len(line["prompt_ids"]), len(line["completion_ids"])
        alone = logits[p - 1 : p - 1 + n].log_softmax(-1).gather(-1, torch.tensor(line["completion_ids"])[:, None])
        assert record["trainer_logprobs"] == pytest.approx(alone[:, 0].tolist(), abs=1e-4)


def test_in_the_mode_the_packed_layout_gives_the_padded_layout_s_bits(rollouts_file, tmp_path):
    packed = _records(rollouts_file, tmp_path, "--invariant", "--layout", "packed")
    padded = _records(rollouts_file, tmp_path, "--invariant")
    assert [r["line"] for r in packed] == [r["line"] for r in padded]
    assert [r["trainer_logprobs"] for r in packed] == [r["trainer_logprobs"] for r in padded]


def test_resume_keeps_the_layout(rollouts_file, tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    main(["rollouts", str(rollouts_file), "--model", "tiny", "--dtype", "float32", "--layout", "packed", "--records",
          str(records), "--quiet"])  # fmt: skip
    capsys.readouterr()
    code = main(["rollouts", str(rollouts_file), "--model", "tiny", "--dtype", "float32", "--records", str(records),
                 "--resume", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "its layout is \"sequences packed in rows" in err, err


def test_a_model_that_cannot_tell_packed_sequences_apart_is_one_line_exit_2(tmp_path, tiny_path, capsys):
    opt = build("opt", tmp_path / "opt", tiny_path)
    rows = [{"prompt_ids": [5, 6, 7], "completion_ids": [8, 9], "logprobs": [-1.0, -2.0]}] * 2
    path = write_jsonl(tmp_path / "two.jsonl", rows)
    code = main(["rollouts", str(path), "--model", str(opt), "--layout", "packed", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "does not tell packed sequences apart by their positions" in err, err
    assert len(err.strip().splitlines()) == 1


def test_trl_s_call_in_the_packed_layout_is_one_line_exit_2(rollouts_file, capsys):
    code = main(["rollouts", str(rollouts_file), "--model", "tiny", "--layout", "packed", "--trainer", "trl"])
    err = capsys.readouterr().err
    assert code == 2 and "--trainer trl scores in TRL's GRPO layout" in err and len(err.strip().splitlines()) == 1
