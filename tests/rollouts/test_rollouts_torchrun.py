"""`batchtui rollouts` under torchrun: 2 CPU processes (gloo, on localhost) split the plan's batches and rank 0 writes
the one report; the records and the summary are a single process's (one thread a rank, as torchrun sets, against
`--threads 1`), with and without the mode."""

import json
import shutil
import subprocess
import sys

import pytest
from rollout_files import sampled_rollouts, write_jsonl

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
    records = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    assert len({r["batch"] for r in records}) >= 4  # batches on both ranks
