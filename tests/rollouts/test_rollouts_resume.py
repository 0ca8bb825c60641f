"""`batchtui rollouts` stopped and resumed: a stop anywhere (between batches, inside one's writing, a real SIGINT)
leaves whole records, and `--resume` scores only the rest: the records file and the summary come out as an
uninterrupted run's, nothing twice, nothing lost."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.rollout_files import records_in, sampled_rollouts, write_jsonl

from batchtui.core.cli import main
from batchtui.core.cli.exit_codes import EXIT_INTERRUPTED
from batchtui.core.rollouts import records as rollout_records

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

ARGS = ["--model", "tiny", "--dtype", "float32", "--batch-tokens", "40", "--quiet"]


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    path = write_jsonl(folder / "in.jsonl", sampled_rollouts("tiny", 16, new_tokens=4))
    whole = folder / "whole.records.jsonl"
    report = folder / "whole.json"
    assert main(["rollouts", str(path), *ARGS, "--records", str(whole), "--json", str(report)]) == 1
    return path, whole.read_bytes(), _summary(report)


def _summary(report) -> dict:
    summary = json.loads(report.read_text())["rollouts"]
    summary.pop("elapsed_s")
    summary.pop("resumed")
    return summary


@pytest.mark.parametrize("stop_at", [1, 3, 4, 9, 16])  # the first write, inside a batch, at a batch's end, the last
def test_a_run_stopped_at_any_record_resumes_to_the_uninterrupted_run_s_records_and_summary(
    rollouts, stop_at, tmp_path, monkeypatch
):
    path, whole, summary = rollouts
    records, report = tmp_path / "records.jsonl", tmp_path / "r.json"
    write = rollout_records.RecordsFile.write
    writes = [0]

    def stopping(self, record):
        writes[0] += 1
        if writes[0] == stop_at:
            raise KeyboardInterrupt  # Ctrl+C while this record is being written
        write(self, record)

    monkeypatch.setattr(rollout_records.RecordsFile, "write", stopping)
    assert main(["rollouts", str(path), *ARGS, "--records", str(records)]) == EXIT_INTERRUPTED
    monkeypatch.setattr(rollout_records.RecordsFile, "write", write)
    kept = records.read_bytes()
    # whole lines only, the earlier ones (the first after the run's settings line, written with the first record)
    assert whole.startswith(kept) and kept.count(b"\n") == (stop_at if stop_at > 1 else 0)
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume", "--json", str(report)]) == 1
    assert records.read_bytes() == whole
    assert _summary(report) == summary
    assert json.loads(report.read_text())["rollouts"]["resumed"] == stop_at - 1


def test_a_cut_last_line_is_dropped_and_scored_again(rollouts, tmp_path):
    path, whole, summary = rollouts
    records, report = tmp_path / "records.jsonl", tmp_path / "r.json"
    lines = whole.splitlines(keepends=True)
    records.write_bytes(b"".join(lines[:5]) + lines[5][:30])  # a process killed inside a write
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume", "--json", str(report)]) == 1
    assert records.read_bytes() == whole and _summary(report) == summary


def test_resuming_a_finished_run_scores_nothing_and_gives_the_same_summary(rollouts, tmp_path):
    path, whole, summary = rollouts
    records, report = tmp_path / "records.jsonl", tmp_path / "r.json"
    records.write_bytes(whole)
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume", "--json", str(report)]) == 1
    assert records.read_bytes() == whole and _summary(report) == summary


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (["--batch-tokens", "80"], "its batch_tokens is 40, this run's 80"),  # another plan
        (["--dtype", "bfloat16"], 'its dtype is "float32", this run\'s "bfloat16"'),
        (["--invariant"], "its invariant is false, this run's true"),
        (["--model", "qwen2-english-4m"], 'its model is "tiny", this run\'s "qwen2-english-4m"'),
        (["--temperature", "0.5"], "its temperature is 1.0, this run's 0.5"),
    ],
    ids=["batch-tokens", "dtype", "mode", "model", "temperature"],
)
def test_resuming_with_other_settings_is_one_line_naming_the_setting(rollouts, change, said, tmp_path, capsys):
    """A records file holds the settings of the run that wrote it: --resume with another dtype, mode, model or
    batching would mix two runs in one summary."""
    path, whole, _ = rollouts
    records = tmp_path / "records.jsonl"
    kept = whole[: whole.index(b"\n", whole.index(b"\n") + 1) + 1]  # the settings and a first record
    records.write_bytes(kept)
    args = [*ARGS, *change] if change[0] != "--model" else [*change, *ARGS[2:]]
    assert main(["rollouts", str(path), *args, "--records", str(records), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was written by another run" in err and said in err, err
    assert records.read_bytes() == kept


def test_records_of_another_input_or_plan_are_refused(rollouts, tmp_path, capsys):
    path, whole, _ = rollouts
    records = tmp_path / "records.jsonl"
    records.write_bytes(whole)
    other = tmp_path / "other.jsonl"  # the same settings, another input
    other.write_bytes(b"\n".join(reversed(path.read_bytes().splitlines())) + b"\n")
    assert main(["rollouts", str(other), *ARGS, "--records", str(records), "--resume"]) == 2
    assert "does not go with" in capsys.readouterr().err
    records.write_bytes(b'{"line": 1}\n')
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume"]) == 2
    assert "does not say which run wrote it" in capsys.readouterr().err
    assert records.read_bytes() == b'{"line": 1}\n'  # nothing appended
    records.write_bytes(b'{"other": 1}\n')
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume"]) == 2
    assert "line 1: not a record of `batchtui rollouts`" in capsys.readouterr().err


def test_an_existing_records_file_is_never_overwritten_without_resume(rollouts, tmp_path, capsys):
    path, *_ = rollouts
    records = tmp_path / "records.jsonl"
    records.write_text("mine\n")
    assert main(["rollouts", str(path), *ARGS, "--records", str(records)]) == 2
    assert "exists: --resume continues it" in capsys.readouterr().err and records.read_text() == "mine\n"


def test_a_file_that_is_not_records_loses_nothing_to_resume_even_without_a_newline(rollouts, tmp_path, capsys):
    """Only the start of a record, after whole records of this run, is a cut line to drop: notes kept whole."""
    path, *_ = rollouts
    notes = tmp_path / "notes.txt"
    for content in (b"my notes, no newline", b"first line\nmy notes, no newline", b"{\"lines\": 3"):
        notes.write_bytes(content)
        assert main(["rollouts", str(path), *ARGS, "--records", str(notes), "--resume"]) == 2
        assert "not a record of `batchtui rollouts`" in capsys.readouterr().err
        assert notes.read_bytes() == content


def test_a_second_run_on_a_records_file_in_use_is_one_line_and_exit_2(rollouts, tmp_path, capsys):
    """Another run holds the file (its lock, taken as it opens it): neither a fresh run nor --resume appends."""
    path, whole, _ = rollouts
    records = tmp_path / "records.jsonl"
    records.write_bytes(whole[: whole.index(b"\n") + 1])
    other = rollout_records.RecordsFile(str(records), resume=True, run={})  # a run still writing it
    try:
        assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is being written by another run" in err, err
    finally:
        other.close()
    assert records.read_bytes() == whole[: whole.index(b"\n") + 1]  # untouched by the refused run
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume"]) == 1  # once it is free
    assert records.read_bytes() == whole


def test_a_fifo_as_records_is_refused_at_once_never_waited_on(rollouts, tmp_path):
    path, *_ = rollouts
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    for resume in (["--resume"], []):
        done = subprocess.run(
            [sys.executable, "-m", "batchtui.core", "rollouts", str(path), *ARGS, "--records", str(fifo), *resume],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "not a regular file" in done.stderr or "exists" in done.stderr


@pytest.mark.slow
def test_a_real_sigint_leaves_whole_records_and_resume_completes(tmp_path):
    """The command in its own process, stopped by SIGINT once some records are written (bounded in time)."""
    path = write_jsonl(tmp_path / "in.jsonl", sampled_rollouts("qwen2-english-4m", 48, new_tokens=16, batch=8))
    records = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "batchtui.core", "rollouts", str(path), "--model", "qwen2-english-4m",
               "--dtype", "float32", "--batch-tokens", "24", "--records", str(records), "--quiet"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline:
            if records.exists() and records.stat().st_size:
                process.send_signal(signal.SIGINT)
                break
            time.sleep(0.005)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    lines = records.read_bytes().splitlines(keepends=True)[1:]  # (after the run's settings)
    assert all(line.endswith(b"\n") for line in lines)
    if process.returncode == EXIT_INTERRUPTED:
        assert f"batchtui: interrupted; {len(lines)} of 48 sequences in".encode() in err and 0 < len(lines) < 48
        assert err.rstrip().endswith(b"--resume scores the rest")
    resumed = subprocess.run([*command, "--resume"], capture_output=True, timeout=300, env=os.environ)
    assert resumed.returncode in (0, 1), resumed.stderr
    done = [record["line"] for record in records_in(records)]
    assert sorted(done) == list(range(1, 49))  # every rollout once


def test_a_records_file_that_cannot_grow_is_one_line_exit_2_and_stays_resumable(rollouts, tmp_path):
    """The records file hits the process's file size limit (as a full disk would stop it): one line saying so, exit
    2, the records before it whole; --resume, with room again, completes them as an uninterrupted run."""
    import resource

    path, whole, summary = rollouts
    records = tmp_path / "records.jsonl"
    limit = len(whole) // 3

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (EFBIG from the write, not the signal's kill)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", "batchtui.core", "rollouts", str(path), *ARGS, "--records", str(records)]
    done = subprocess.run(command, preexec_fn=limited, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot write records file" in done.stderr and "File too large" in done.stderr
    assert "--resume goes on from them" in done.stderr
    kept = records.read_bytes()
    assert whole.startswith(kept[: kept.rfind(b"\n") + 1]) and len(kept) <= limit
    report = tmp_path / "r.json"
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume", "--json", str(report)]) == 1
    assert records.read_bytes() == whole and _summary(report) == summary


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda r: {**r, "trainer_logprobs": [abs(v) + 0.5 for v in r["trainer_logprobs"]]}, "trainer logprob above 0"),
        (lambda r: {**r, "completion_ids": [(i + 1) % 512 for i in r["completion_ids"]]}, "are not line 1's: edited"),
        (lambda r: {**r, "sampler_logprobs": [v - 1 for v in r["sampler_logprobs"]]}, "are not line 1's: edited"),
        (lambda r: {**r, "digest": "0" * 16}, "line 1 of"),
    ],
    ids=["positive-trainer", "other-ids", "other-sampler", "digest"],
)
def test_an_edited_record_is_refused_naming_what_changed(rollouts, edit, said, tmp_path, capsys):
    path, whole, _ = rollouts
    records = tmp_path / "records.jsonl"
    header, *lines = whole.splitlines(keepends=True)
    first = json.dumps(edit(json.loads(lines[0]))).encode() + b"\n"
    records.write_bytes(header + first + b"".join(lines[1:4]))
    assert main(["rollouts", str(path), *ARGS, "--records", str(records), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "record 1" in err, err
    assert records.read_bytes() == header + first + b"".join(lines[1:4])  # nothing appended


def test_lines_added_or_changed_after_the_check_are_never_scored(rollouts, tmp_path, monkeypatch, capsys):
    """The file grows between the checking pass and the scoring pass: exactly the lines checked are scored (a new
    line, good or bad, is not); a checked line that turned bad ends the run in one line."""
    from batchtui.core.rollouts import scoring

    path, whole, summary = rollouts
    grown = tmp_path / "in.jsonl"
    grown.write_bytes(path.read_bytes())
    original = grown.read_bytes()
    reads = []
    real = scoring.read_rollouts

    def appending(file, *args, **kwargs):
        reads.append(file)
        if len(reads) == 2:  # the scoring pass starts: another writer adds a good and a bad line
            with open(file, "ab") as handle:
                handle.write(original.splitlines(keepends=True)[0] + b"{not json\n")
        return real(file, *args, **kwargs)

    monkeypatch.setattr(scoring, "read_rollouts", appending)
    report = tmp_path / "r.json"
    assert main(["rollouts", str(grown), *ARGS, "--json", str(report)]) == 1
    assert _summary(report) == summary  # the 16 checked, nothing else
    reads.clear()

    def changing(file, *args, **kwargs):
        reads.append(file)
        if len(reads) == 2:
            grown.write_bytes(original.replace(b'"logprobs": [', b'"logprobs": [1.5, ', 1))
        return real(file, *args, **kwargs)

    grown.write_bytes(original)
    monkeypatch.setattr(scoring, "read_rollouts", changing)
    assert main(["rollouts", str(grown), *ARGS]) == 2
    err = capsys.readouterr().err
    assert "changed since it was checked" in err and err.count("batchtui: error") == 1
