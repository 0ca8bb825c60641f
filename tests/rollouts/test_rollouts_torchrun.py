"""`batchtui rollouts` under torchrun: 2 CPU processes (gloo, on localhost) split the plan's batches and rank 0 writes
the one report; the records and the summary are a single process's (one thread a rank, as torchrun sets, against
`--threads 1`), with and without the mode."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from helpers.rollout_files import records_in, sampled_rollouts, write_jsonl

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)


def _summary(path) -> dict:
    report = json.loads(path.read_text())
    report["rollouts"].pop("elapsed_s")
    report["config"].pop("ranks")
    report["config"].pop("records")
    return report


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "program"),
    [([], ["-m", "batchtui.core"]), (["--invariant"], ["-m", "batchtui.core"]), ([], [shutil.which("batchtui")])],
    ids=["library", "mode", "entry-point"],
)
def test_two_ranks_give_the_single_process_s_records_and_summary(mode, program, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", sampled_rollouts("tiny", 18, new_tokens=5))
    args = ["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--batch-tokens", "40", "--quiet", *mode]
    single = subprocess.run(
        [sys.executable, "-m", "batchtui.core", *args, "--threads", "1", "--records", str(tmp_path / "one.jsonl"),
         "--json", str(tmp_path / "one.json")], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    ranks = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *program, *args,
         "--records", str(tmp_path / "two.jsonl"), "--json", str(tmp_path / "two.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode in (0, 1), single.stderr
    assert ranks.returncode == single.returncode, ranks.stderr[-2000:]
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert _summary(tmp_path / "two.json") == _summary(tmp_path / "one.json")
    assert json.loads((tmp_path / "two.json").read_text())["config"]["ranks"] == 2
    assert ranks.stdout.count("tokens scored") == 1  # one report, rank 0's
    records = records_in(tmp_path / "two.jsonl")
    assert len({r["batch"] for r in records}) >= 4  # batches on both ranks


def _command(path, *more) -> list[str]:
    return [sys.executable, "-m", "batchtui.core", "rollouts", str(path), "--model", "tiny", "--quiet", *more]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"WORLD_SIZE": "2", "RANK": "5"}, "RANK=5 is not below WORLD_SIZE=2"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "without MASTER_ADDR and MASTER_PORT"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: no ranks at all"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a whole number"),
    ],
    ids=["rank-past", "not-a-number", "nowhere-to-meet", "zero", "local-rank"],
)
def test_torchrun_s_variables_set_by_hand_are_one_line_and_exit_2(env, said, tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5]}])
    done = subprocess.run(_command(path), capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_ranks_that_never_come_end_the_run_within_its_dist_timeout(tmp_path):
    """WORLD_SIZE=1000 by hand, one process: it waits --dist-timeout for the others, then one line, exit 2."""
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5]}])
    env = {**os.environ, "WORLD_SIZE": "1000", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(_free_port())
    started = time.monotonic()
    done = subprocess.run(_command(path, "--dist-timeout", "2"), capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and time.monotonic() - started < 100, done.stderr
    assert "the 1000 ranks did not all meet within 2 s (--dist-timeout)" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_others_in_one_line_with_the_records_resumable(tmp_path):
    """Two ranks started by hand; rank 1 is killed once rank 0 has written records: rank 0 ends within its
    --dist-timeout in one line naming the records, and --resume in one process completes them as an uninterrupted
    run would."""
    path = write_jsonl(tmp_path / "in.jsonl", sampled_rollouts("qwen2-english-4m", 64, new_tokens=16, batch=8))
    records = tmp_path / "records.jsonl"
    args = ["--model", "qwen2-english-4m", "--dtype", "float32", "--batch-tokens", "24", "--threads", "1"]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    first = subprocess.Popen(
        [*_command(path, *args, "--records", str(records), "--dist-timeout", "10")],
        env={**env, "RANK": "0", "LOCAL_RANK": "0"}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    second = subprocess.Popen(_command(path, *args), env={**env, "RANK": "1", "LOCAL_RANK": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (records.exists() and records.stat().st_size):
            time.sleep(0.01)
        second.kill()
        _, err = first.communicate(timeout=120)
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
    if first.returncode in (0, 1):  # (it finished before the kill landed: nothing to show, and said so)
        pytest.skip("rank 0 finished before rank 1 was killed")
    assert first.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "another rank stopped or did not answer" in lines[0], err
    assert lines[0].endswith("--resume scores the rest"), err
    whole = records.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") for line in whole) and len(whole) > 1  # the run's settings and records
    resumed = subprocess.run(_command(path, *args, "--records", str(records), "--resume"), capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert resumed.returncode in (0, 1), resumed.stderr
    done = [record["line"] for record in records_in(records)]
    assert sorted(done) == list(range(1, 65))
