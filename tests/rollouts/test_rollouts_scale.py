"""`batchtui rollouts` at a dataset's scale: peak memory stays flat in the number of rollouts (5x the rollouts, less
than 100 MiB more), each measured in a process of its own."""

import json
import random
import subprocess
import sys

import pytest

_PEAK = """
import resource, sys
from batchtui.core.cli import main
code = main(sys.argv[1:])
print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, code)
"""


def _synthetic(path, count: int) -> None:
    """Rollouts of the tiny model's vocabulary with made-up sampler logprobs: memory does not care what they say."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            prompt = [rng.randrange(512) for _ in range(rng.randrange(4, 24))]
            completion = [rng.randrange(512) for _ in range(rng.randrange(8, 24))]
            logprobs = [-rng.random() * 6 for _ in completion]
            out.write(json.dumps({"prompt_ids": prompt, "completion_ids": completion, "logprobs": logprobs}) + "\n")


def _peak_kib(path, tmp_path, name: str) -> int:
    records = tmp_path / f"{name}.records.jsonl"
    args = ["rollouts", str(path), "--model", "tiny", "--dtype", "float32", "--quiet", "--records", str(records),
            "--json", str(tmp_path / f"{name}.json")]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=600)
    peak = [line for line in done.stdout.splitlines() if line.startswith("peak ")]
    assert peak and peak[0].split()[2] in ("0", "1"), done.stderr[-2000:]
    return int(peak[0].split()[1])


@pytest.mark.slow
def test_five_times_the_rollouts_cost_less_than_100_mib_more_at_peak(tmp_path):
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    _synthetic(small, 600)
    _synthetic(large, 3000)
    grown = _peak_kib(large, tmp_path, "large") - _peak_kib(small, tmp_path, "small")
    assert grown < 100 * 1024, f"{grown / 1024:.0f} MiB more at 5x the rollouts"
    assert json.loads((tmp_path / "large.json").read_text())["rollouts"]["sequences"] == 3000
