"""What the hardware under us does well: the precision to autocast in, and allocator tuning.

Precision: `auto` picks bf16 only where it runs natively (CUDA with bf16, or a CPU whose oneDNN
has bf16 kernels: AVX512-BF16 or AMX). On an AVX2-only CPU bf16 matmuls are emulated and about
10x slower than fp32, so `auto` trains in fp32 there.

Allocator: glibc returns freed blocks above 128 KiB to the kernel, so every step faults in
fresh zeroed pages for the same activations; that costs a few percent of a small model's step
(see benchmarks/throughput.py, the faults/step column). Keeping freed memory in the heap lets
each step reuse the last step's pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap threshold to its 32 MiB maximum and stop heap trimming below 1 GiB.

    Returns whether the settings took effect; other C libraries are left alone.
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    _done = bool(mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) and mallopt(_M_TRIM_THRESHOLD, 2**30))
    return _done


def bf16_is_native(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_precision(setting: str, device: torch.device | None = None) -> str:
    """`auto` -> bf16 where it is native, else no; other settings pass through."""
    if setting != "auto":
        return setting
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return "bf16" if bf16_is_native(device) else "no"
