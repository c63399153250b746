"""How much memory this machine has free: what a model's files and tensors are bounded by before they are read."""

from __future__ import annotations


def available_memory_bytes() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), else None (a machine that does not say is not checked)."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None
