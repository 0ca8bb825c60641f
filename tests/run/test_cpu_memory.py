"""Freed memory kept for reuse: the commands' process setting, observed in a fresh process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = """
import torch
from batchtui.core.numbers.cpu_memory import keep_freed_memory
def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096
def held_after_free():
    before = rss()
    block = torch.ones(4 << 20)  # 16 MiB, touched
    del block
    return (rss() - before) >> 20
torch.ones(1024)  # the kernel's first call: code pages and buffers that stay, whoever asks
default = held_after_free()
print(keep_freed_memory(), default, held_after_free())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and /proc")
def test_a_freed_block_stays_for_reuse_only_once_asked():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
    kept, default, held = out.split()
    if kept == "False":
        pytest.skip("not glibc")
    assert int(default) <= 4  # glibc's default hands a freed 16 MiB block back at once
    assert int(held) - int(default) >= 12  # asked to keep it, the block stays on the heap, ready for the next one
