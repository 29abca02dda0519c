"""The facts of the machine and software a run trains on: package versions, Python, the CPU's
flags of interest, the GPUs and threads. Cheap to gather (no probe, no imports beyond torch):
every run keeps them in env.json, and `stackwise env` prints them with the rest."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

import torch

from stackwise.hwprobe import cpu_description

PACKAGES = (
    "stackwise",
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "datasets",
    "tokenizers",
    "tiktoken",
    "safetensors",
    "pydantic",
)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_flags() -> tuple[str, str]:
    """(the CPU's model name, its flags of interest)."""
    model, flags = cpu_description()
    present = set(flags.split())
    return model, " ".join(f for f in CPU_FLAGS if f in present) or "none of interest"


def cuda_devices() -> list[str]:
    if not torch.cuda.is_available():
        return ["none"]
    lines = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        lines.append(
            f"{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute {p.major}.{p.minor}, "
            f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}"
        )
    return lines


def threads() -> dict[str, Any]:
    """torch's thread counts, the cores this process may use, and the thread variables."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    return {
        "torch intra-op": torch.get_num_threads(),
        "torch inter-op": torch.get_num_interop_threads(),
        "cores usable": affinity,
        **{v: os.environ.get(v, "unset") for v in THREAD_VARS},
    }


def run_machine() -> dict[str, Any]:
    """What a run keeps beside its metrics (env.json), for its report."""
    model, flags = cpu_flags()
    return {
        "versions": {name: version(name) for name in PACKAGES},
        "python": f"{sys.version.split()[0]} ({platform.platform()})",
        "cpu": {
            "model": model,
            "torch capability": torch.backends.cpu.get_cpu_capability(),
            "flags": flags,
        },
        "cuda": cuda_devices(),
        "threads": threads(),
    }
