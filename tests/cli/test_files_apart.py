"""No command writes over a file it reads, or one output over another: the same path, a symlink, a hard link or a
file inside a folder given elsewhere is one line and exit 2 before any work, with every file as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchtui.core.cli import COMMANDS, main
from batchtui.core.threads import most_threads
from batchtui.tui.launcher import build_app

ROLLOUT = b'{"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5]}\n'


@pytest.fixture
def rollouts(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_bytes(ROLLOUT)
    return path


def _same_file_names(path: Path) -> dict[str, str]:
    """Other names of `path`: relative with `..`, through a symlink, a hard link."""
    link, hard = path.with_name("link.jsonl"), path.with_name("hard.jsonl")
    link.symlink_to(path.name)
    os.link(path, hard)
    return {"same": str(path), "dotted": f"{path.parent}/../{path.parent.name}/{path.name}", "symlink": str(link),
            "hard-link": str(hard)}  # fmt: skip


@pytest.mark.parametrize("name", ["same", "dotted", "symlink", "hard-link"])
def test_a_report_over_the_rollouts_file_is_refused_and_the_file_kept(rollouts, name, capsys):
    other = _same_file_names(rollouts)[name]
    assert main(["rollouts", str(rollouts), "--model", "tiny", "--json", other]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--json" in err and "is the rollouts file" in err, err
    assert rollouts.read_bytes() == ROLLOUT


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_records_and_report_on_one_file_are_refused_and_earlier_records_kept(rollouts, resume, capsys):
    records = rollouts.with_name("records.jsonl")
    if resume:
        records.write_bytes(b'{"line": 1}\n')  # an earlier run's records
    assert main(["rollouts", str(rollouts), "--model", "tiny", "--records", str(records), *resume,
                 "--json", str(records)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "are the same file" in err, err
    assert records.read_bytes() == b'{"line": 1}\n' if resume else not records.exists()
    assert main(["rollouts", str(rollouts), "--model", "tiny", "--records", str(rollouts), "--resume"]) == 2
    assert "--records" in capsys.readouterr().err and rollouts.read_bytes() == ROLLOUT


def test_every_command_refuses_an_output_over_its_input(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo\n")
    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "report.json").write_text("{}")
    lines = [
        ["check", "--texts-file", str(texts), "--json", str(texts)],
        ["check", "--texts-file", str(texts), "--repro", str(tmp_path)],  # the texts inside the pack's folder
        ["check", "--from", str(pack), "--json", str(pack / "report.json")],
        ["generate", "--texts-file", str(texts), "--json", str(texts)],
        ["sweep", "--texts-file", str(texts), "--json", str(texts)],
        ["diff", str(texts), str(pack), "--json", str(texts)],
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "--texts-file", str(texts), "--json", str(texts)],
        ["endpoint", "--url", "http://127.0.0.1:9/v1", "--texts-file", str(texts), "--save-rollouts", str(texts)],
    ]
    for line in lines:
        assert main(line) == 2, line
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "give another path" in err, (line, err)
    assert texts.read_text() == "one\ntwo\n" and (pack / "report.json").read_text() == "{}"


def test_the_app_s_session_is_never_a_file_it_reads(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("one\n")
    assert build_app(["--texts-file", str(texts), "--session", str(texts)], set_aside=False) == 2
    assert "--session" in capsys.readouterr().err and texts.read_text() == "one\n"
    assert build_app(["--rollouts", str(texts), "--session", str(texts), "--model", "tiny"], set_aside=False) == 2


def test_threads_past_the_machine_s_bound_are_one_line_in_every_command(capsys):
    """A count OpenMP cannot start (100000 crashed it) is refused by every command that takes --threads."""
    taking = []
    for name in COMMANDS:
        assert main([name, "--help"]) == 0
        if "--threads" in capsys.readouterr().out:
            taking.append(name)
    assert {"check", "generate", "sweep", "bench", "endpoint", "rollouts"} <= set(taking)
    for name in taking:
        assert main([name, "--threads", "100000"]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"must be at most {most_threads()}" in err, (name, err)
    assert build_app(["--threads", str(most_threads() + 1)], set_aside=False) == 2
    assert "must be at most" in capsys.readouterr().err
