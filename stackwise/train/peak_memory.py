"""The log row's memory figure: the peak GPU memory torch allocated, or on a CPU the process's
own peak resident set."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch


def own_peak_rss_mb(status: str = "/proc/self/status") -> float | None:
    """This process's peak resident set in MB. On Linux VmHWM, this process's own: getrusage's
    ru_maxrss also counts the process that started it (torchrun's agent, a benchmark) when
    that one was larger. Elsewhere on POSIX, ru_maxrss; None where neither exists."""
    with contextlib.suppress(OSError), open(status, encoding="utf-8", errors="replace") as f:
        for line in f:  # errors="replace": the Name: line may hold any bytes
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    if sys.platform not in ("linux", "darwin"):
        return None
    import resource  # POSIX only

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
    return peak / (2**20 if sys.platform == "darwin" else 1024)


def peak_memory(accelerator: Any) -> dict[str, float]:
    """The log row's memory figure, the largest over the processes (every rank builds the row):
    the peak GPU memory torch allocated, or on a CPU the process's peak resident set (what the
    OS counts: libraries and allocator slack included)."""
    device = accelerator.device
    if device.type == "cuda":
        key, mb = "train/peak_gpu_mb", torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_rss = own_peak_rss_mb()
        if peak_rss is None:
            return {}
        key, mb = "train/peak_rss_mb", peak_rss
    if accelerator.num_processes > 1:
        value = torch.tensor(mb, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        mb = float(value)
    return {key: mb}
