"""The default thread count: the cores other work keeps busy now, not the ones this tool's last command used."""

import os
import subprocess
import sys

from batchtui.core.threads import _busy_cores_now, busy_cores


def test_busy_cores_are_the_cpus_busy_time_less_this_process_s_own():
    # 100 ticks a second: over 0.1 s two fully busy cores are 20 ticks; 10 of them this process's own.
    assert busy_cores(20, 100, 0.1, 0.1, cores=2) == 1
    assert busy_cores(20, 100, 0.0, 0.1, cores=2) == 2
    assert busy_cores(6, 100, 0.0, 0.1, cores=2) == 1  # most of a core
    assert busy_cores(4, 100, 0.0, 0.1, cores=2) == 0  # less than half of one
    assert busy_cores(40, 100, 0.0, 0.1, cores=2) == 2  # never more than there are
    assert busy_cores(0, 100, 0.05, 0.1, cores=2) == 0  # the tick lagging this process's own count


def test_a_core_another_process_keeps_busy_is_seen_at_once():
    """The 1-minute load average would not show a process started a moment ago."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = _busy_cores_now(len(os.sched_getaffinity(0)))
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and busy >= 1
