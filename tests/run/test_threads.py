"""The default thread count is the same on every run on a machine, whatever else keeps the cores busy: the count
is part of the computation (CPU kernels split their work by it), so a busy moment must not change the bits."""

import os
import subprocess
import sys

import pytest

_COUNT = (
    "import torch; from batchtui.core.threads import use_threads; "
    "own = torch.get_num_threads(); print(own, use_threads(None), use_threads(1), use_threads(None))"
)


@pytest.mark.slow
def test_the_default_is_torch_s_own_count_even_with_every_core_busy():
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        done = subprocess.run([sys.executable, "-c", _COUNT], env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    own, default, asked, again = map(int, done.stdout.split())
    assert default == own == again and asked == 1
