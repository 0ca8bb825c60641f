"""The mode's compiled kernels (attention, float32 and bfloat16 linear layers): built once a machine into the cache
folder, said once, and loaded from there by the next process without a word; where they cannot be built (no compiler)
one line says so and the Python paths keep the promise; `BATCHTUI_COMPILED_KERNELS=0` takes the Python paths without
building.
(Their bits, arrival by arrival, are `test_ordered_attention`'s, `test_fixed_order_linear`'s and the arrival
tests'.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batchtui.core.invariant.compiled_kernels import SWITCH, compiled_attention, compiled_linear

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

CHECK = ["-m", "batchtui.core", "check", "--model", "tiny", "--dtype", "bfloat16", "--invariant", "--bitwise"]
BUILDING = "building the mode's kernels"
FAILED = "the mode's kernels could not be built here"


def _check(cache, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *CHECK], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache), **env})  # fmt: skip


def _built(cache) -> list:
    return sorted((cache / "batchtui" / "compiled").glob("*/batchtui_kernels.so"))


@pytest.mark.slow
def test_it_is_built_once_into_the_cache_folder_and_said_once(tmp_path):
    first, second = _check(tmp_path), _check(tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr  # --bitwise: every text equal
    assert first.stderr.count(BUILDING) == 1 and BUILDING not in second.stderr, first.stderr + second.stderr
    assert FAILED not in first.stderr + second.stderr
    assert len(_built(tmp_path)) == 1


@pytest.mark.slow
def test_without_a_compiler_one_line_says_so_and_the_python_path_keeps_the_promise(tmp_path):
    done = _check(tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    assert done.returncode == 0, done.stderr  # every text bitwise equal to its single run all the same
    said = [line for line in done.stderr.splitlines() if FAILED in line]
    assert len(said) == 1 and "no C++ compiler" in said[0], done.stderr
    assert "Traceback" not in done.stderr and "WARNING" not in done.stderr
    assert _built(tmp_path) == []


@pytest.mark.slow
def test_the_switch_takes_the_python_path_without_building(tmp_path):
    done = _check(tmp_path, **{SWITCH: "0"})
    assert done.returncode == 0, done.stderr
    assert BUILDING not in done.stderr and FAILED not in done.stderr
    assert _built(tmp_path) == []


def test_only_cpu_tensors_take_the_compiled_kernels_and_the_linear_float32_and_bfloat16_alone(monkeypatch):
    assert compiled_attention(torch.zeros(1, device="meta")) is None
    assert compiled_linear(torch.zeros(1, device="meta")) is None
    assert compiled_linear(torch.zeros(1, dtype=torch.bfloat16)) is not None
    assert compiled_linear(torch.zeros(1, dtype=torch.float16)) is None
    assert compiled_linear(torch.zeros(1, dtype=torch.float64)) is None
    monkeypatch.setenv(SWITCH, "0")
    assert compiled_attention(torch.zeros(1)) is None
    assert compiled_linear(torch.zeros(1)) is None


@pytest.mark.slow
def test_a_build_lock_left_by_a_killed_process_is_cleared_not_waited_for(tmp_path):
    """torch's extension tools wait for a `lock` file in the build folder to go; one minutes old is a dead build's."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    where = "from batchtui.core.invariant.compiled_kernels import _folder; print(_folder())"
    folder = subprocess.run([sys.executable, "-c", where], capture_output=True, text=True, env=env, check=True)
    lock = Path(folder.stdout.strip()) / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (0, 0))  # left long ago
    done = _check(tmp_path)
    assert done.returncode == 0, done.stderr
    assert FAILED not in done.stderr and len(_built(tmp_path)) == 1
