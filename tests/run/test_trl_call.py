"""`--trainer trl`: the trainer's forward as TRL's GRPO trainer makes it (no position ids, TRL's fused LM head), checked
against TRL's own head called here on a layout built here; which of the two ways moves the logprobs, counted as the
test counts it; in the mode neither moves any; the commands say so, and refuse a TRL they do not cover in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers.rollout_files import records_in, sampled_rollouts, write_jsonl
from transformers import AutoModelForCausalLM

from batchtui.core.cli import main
from batchtui.core.errors import InputError
from batchtui.core.invariant.mode import invariant_if
from batchtui.core.models.builtin import builtin_path
from batchtui.core.models.loading import load_model
from batchtui.core.run import trl_call
from batchtui.core.run.trainer_forward import DEFAULT, TRL, scored_in_training, trainer_modes, trl_parts_of
from batchtui.core.settings import Settings

trl_utils = pytest.importorskip("trl.trainer.utils")

# prompts of three lengths (left padding of 0, 2 and 4) and completions of three
PROMPTS = [[11, 12, 13, 14, 15, 16], [21, 22, 23, 24], [31, 32]]
COMPLETIONS = [[41, 42, 43], [51, 52, 53, 54, 55], [61]]


@pytest.fixture(scope="module")
def loaded():
    return load_model(Settings(model="tiny", dtype="float32").validated())


def _by_hand(pad: int, positions: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """TRL's layout built here: prompts left-padded, completions right-padded; positions from the mask if asked."""
    width_p, width_c = max(map(len, PROMPTS)), max(map(len, COMPLETIONS))
    ids = [[pad] * (width_p - len(p)) + p + c + [pad] * (width_c - len(c)) for p, c in zip(PROMPTS, COMPLETIONS)]
    mask = [[0] * (width_p - len(p)) + [1] * (len(p) + len(c)) + [0] * (width_c - len(c))
            for p, c in zip(PROMPTS, COMPLETIONS)]  # fmt: skip
    ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
    return ids_t, mask_t, (mask_t.cumsum(-1) - 1).clamp(min=0) if positions else None


def _trl_s_own(pad: int, positions: bool) -> list[list[float]]:
    """Each completion's logprobs from TRL's own fused head on a fresh copy of the model, called as TRL calls it."""
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"), dtype=torch.float32)
    model.train()
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids, mask, position_ids = _by_hand(pad, positions)
    width = max(map(len, COMPLETIONS))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-width] = -100
    given = {} if position_ids is None else {"position_ids": position_ids}
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, **given)
    logps = out.log_probs[:, -width:].detach().float()
    return [logps[row, : len(c)].tolist() for row, c in enumerate(COMPLETIONS)]


def _scored(loaded, call) -> list[list[float]]:
    with trainer_modes(loaded.model):
        scores = scored_in_training(loaded.model, PROMPTS, COMPLETIONS, loaded.pad_token_id, call=call)
    return [s.logprobs.tolist() for s in scores]


def test_the_trl_call_is_trl_s_own_to_the_bit_and_leaves_the_model_as_it_was(loaded):
    forward = loaded.model.forward
    assert _scored(loaded, TRL) == _trl_s_own(loaded.pad_token_id, positions=False)
    assert loaded.model.forward == forward and "forward" not in vars(loaded.model)  # TRL's head taken off
    with trainer_modes(loaded.model):
        scores = scored_in_training(loaded.model, PROMPTS, COMPLETIONS, loaded.pad_token_id, call=TRL, entropy=True)
    assert all(s.top1 is None and s.entropy is not None and (s.entropy >= 0).all() for s in scores)


def test_the_parts_count_what_each_way_moves_and_the_mode_leaves_none(loaded):
    pad = loaded.pad_token_id
    with trainer_modes(loaded.model):
        parts = trl_parts_of(loaded.model, PROMPTS, COMPLETIONS, pad)
    as_trl, with_positions = _trl_s_own(pad, positions=False), _trl_s_own(pad, positions=True)
    from_logits = _scored(loaded, DEFAULT)
    flat = [(a, b, c) for rows in zip(as_trl, with_positions, from_logits) for a, b, c in zip(*rows, strict=True)]
    assert parts.tokens == sum(map(len, COMPLETIONS)) == len(flat)
    assert parts.by_positions == sum(a != b for a, b, _ in flat)
    assert parts.by_head == sum(b != c for _, b, c in flat)
    assert parts.max_by_head == max((abs(b - c) for _, b, c in flat), default=0.0)
    # the padded rows' positions start at their padding: another rotary angle, other logprobs, on every machine
    padded_tokens = len(COMPLETIONS[1]) + len(COMPLETIONS[2])
    assert 0 < parts.by_positions <= padded_tokens
    with invariant_if(True, loaded.model, Settings().kernel_classes), trainer_modes(loaded.model):
        in_mode = trl_parts_of(loaded.model, PROMPTS, COMPLETIONS, pad)
    assert (in_mode.by_positions, in_mode.by_head) == (0, 0)


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("trl") / "sampled.jsonl", sampled_rollouts("tiny", 6, new_tokens=6))


def test_rollouts_scores_as_trl_and_says_which_way_moves_and_resume_keeps_the_call(rollouts_file, tmp_path, capsys):
    records, report = tmp_path / "records.jsonl", tmp_path / "r.json"
    code = main(["rollouts", str(rollouts_file), "--model", "tiny", "--dtype", "float32", "--trainer", "trl",
                 "--records", str(records), "--json", str(report), "--quiet"])  # fmt: skip
    out = capsys.readouterr().out
    assert code in (0, 1)
    written = json.loads(report.read_text())
    summary, parts = written["rollouts"], written["rollouts"]["trl_parts"]
    assert written["config"]["trainer"] == "trl" and summary["top1_disagree"] is None
    assert parts["tokens"] == 36 and parts["by_positions"] > 0  # the file's prompts are of several lengths
    assert "scored as TRL calls the model: of the first batch's 36 tokens, the missing position ids move" in out
    capsys.readouterr()
    code = main(["rollouts", str(rollouts_file), "--model", "tiny", "--dtype", "float32", "--records", str(records),
                 "--resume", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and 'its trainer is "trl", this run\'s "batchtui"' in err, err


def _command(*argv: str) -> subprocess.CompletedProcess:
    """A command in a process of its own: TRL not imported before the mode is entered, as on a user's command line."""
    return subprocess.run([sys.executable, "-m", "batchtui.core", *argv], capture_output=True, text=True, timeout=300)


def test_generate_vs_trainer_as_trl_in_the_mode_is_bitwise_and_says_neither_way_moves(tmp_path):
    report = tmp_path / "g.json"
    done = _command("generate", "--model", "tiny", "--dtype", "float32", "--invariant", "--max-new-tokens", "4",
                    "--vs-trainer", "--trainer", "trl", "--json", str(report), "a", "The quick brown fox")  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads(report.read_text())["summary"]
    assert summary["trainer_vs_sampler"]["max_abs_diff"] == 0.0
    assert summary["trl_parts"]["by_positions"] == summary["trl_parts"]["by_head"] == 0
    assert "none moves without position ids nor through TRL's fused LM head" in done.stdout


def test_rollouts_as_trl_in_the_mode_scores_every_token_as_the_default_call_does(rollouts_file, tmp_path):
    """In the mode TRL's call gives each token the bits of positions from the mask and log_softmax of the logits."""
    records = {}
    for trainer in ("trl", "batchtui"):
        records[trainer] = tmp_path / f"{trainer}.records.jsonl"
        done = _command("rollouts", str(rollouts_file), "--model", "tiny", "--dtype", "float32", "--invariant",
                        "--trainer", trainer, "--records", str(records[trainer]), "--quiet")  # fmt: skip
        assert done.returncode in (0, 1), done.stderr
    trl, ours = records_in(records["trl"]), records_in(records["batchtui"])
    assert len(trl) == len(ours) == 6
    assert [r["trainer_logprobs"] for r in trl] == [r["trainer_logprobs"] for r in ours]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["generate", "--model", "tiny", "--trainer", "trl", "a"], "--trainer says how the trainer calls the model"),
        (["rollouts", "x.jsonl", "--model", "tiny", "--trainer", "trl"], "reproduces TRL 1.16's call of the model, "
         "not TRL 0.9.0's"),
    ],
)  # fmt: skip
def test_a_trl_it_does_not_cover_or_a_call_without_a_trainer_is_one_line_exit_2(monkeypatch, capsys, argv, said):
    monkeypatch.setattr(trl_call.metadata, "version", lambda name: "0.9.0")
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_no_trl_installed_is_one_line_saying_how_to_install(monkeypatch):
    def missing(name):
        raise trl_call.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(trl_call.metadata, "version", missing)
    with pytest.raises(InputError, match=r"install TRL \(pip install 'trl==1.16.\*'\)"):
        trl_call.check_trl()
