"""Which CPU this is, as /proc/cpuinfo says: its model name and its flags (the instruction sets its kernels may take).
Read once a process; where there is no /proc/cpuinfo, the platform's words and no flags."""

from __future__ import annotations

import functools
import platform


@functools.cache
def cpu_identity() -> tuple[str, str]:
    """(the CPU's model name, its flags sorted and joined by spaces)."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                name, _, value = line.partition(":")
                name = name.strip()
                if name == "model name" and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags
