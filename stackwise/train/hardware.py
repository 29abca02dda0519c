"""What the hardware under us does well: the precision to autocast in, and allocator tuning.

Precision: `auto` picks bf16 on CUDA with bf16, and on a CPU only where the probe
(`stackwise.hwprobe`) found bf16 matmuls working, run by oneDNN's bf16 kernels, and at least
`MIN_SPEEDUP` times as fast as fp32. On an AVX2-only CPU they are emulated and about 10x slower
than fp32, and on some AMX VMs they trap or run slower than fp32: `auto` trains in fp32 there.

Allocator: glibc returns freed blocks above 128 KiB to the kernel, so every step faults in
fresh zeroed pages for the same activations; that costs a few percent of a small model's step
(see benchmarks/throughput.py, the faults/step column). Keeping freed memory in the heap lets
each step reuse the last step's pages.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import sys
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.hwprobe import FORCE_ENV, ensure_bf16_ready
from stackwise.launcher import fsdp_launch, hide_fsdp_launch
from stackwise.quiet import quiet_deepspeed_without_gpu

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
    """Whether the hardware has bf16 kernels (not emulation); says nothing about speed here."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_precision(setting: str, device: torch.device | None = None) -> str:
    """`auto` -> bf16 where bf16 works and beats fp32 (the probe measures that on CPUs), else
    `no`. An explicit `bf16` on a CPU whose bf16 matmuls crash under every cap is refused;
    `fp16` on a CPU (emulated there) takes auto's choice, said once."""
    device = device or _default_device()
    if setting == "fp16" and device.type == "cpu":  # emulated there, about 100x slower
        resolved = resolve_precision("auto", device)
        _note_fp16_on_cpu(resolved)
        return resolved
    if device.type != "cpu":
        if setting == "auto":
            return "bf16" if bf16_is_native(device) else "no"
        return setting
    verdict = ensure_bf16_ready()
    if verdict.forced and verdict.error:
        raise StackWiseError(f"{verdict.error}.")
    if setting == "bf16" and not verdict.works and verdict.trapped:
        raise StackWiseError(
            f"train.mixed_precision=bf16 cannot run on this CPU: {verdict.summary()}. "
            "Use mixed_precision=no (fp32) or auto."
        )
    if setting != "auto":
        return setting
    return "bf16" if verdict.bf16_fast else "no"


_fp16_noted: list[bool] = []  # said once per process


def _note_fp16_on_cpu(resolved: str) -> None:
    """fp16 asked for on a CPU: the run takes auto's choice instead, and says so once."""
    if _fp16_noted or os.environ.get("RANK", "0") != "0":
        return
    _fp16_noted.append(True)
    name = "fp32" if resolved == "no" else resolved
    print(
        "stackwise: note: fp16 (train.mixed_precision) needs a CUDA GPU; a CPU only emulates "
        f"it, about 100x slower, so this run uses auto's choice for this CPU instead: {name}.",
        file=sys.stderr,
    )


def describe_precision(setting: str, device: torch.device | None = None) -> str:
    """The resolved precision and why, for a run's header line."""
    device = device or _default_device()
    resolved = resolve_precision(setting, device)
    name = "fp32" if resolved == "no" else resolved
    if device.type != "cpu":
        return name if setting != "auto" else f"{name} (auto)"
    verdict = ensure_bf16_ready()
    ratio = verdict.speedup
    measured = (
        f"bf16 matmul {ratio:.2f}x the speed of fp32 on this CPU"
        + (", emulated" if verdict.native is False else "")
        + (f", forced by {FORCE_ENV}={verdict.forced}" if verdict.forced else "")
        if ratio is not None
        else verdict.summary()
    )
    how = {"auto": "auto: ", "fp16": "fp16 needs a CUDA GPU, so auto: "}.get(setting, "")
    return f"{name} ({how}{measured})"


def process_state() -> Any:
    """Accelerate's process state (rank, world, device) before any Accelerator exists. It is a
    singleton, so it must be made as make_accelerator makes it: told it may run on the CPU,
    or DDP under torchrun would never start."""
    from accelerate import PartialState

    hide_fsdp_launch()
    return PartialState(cpu=not torch.cuda.is_available())


def release_processes() -> None:
    """Destroy the process group at a command's normal end. Left alive, gloo's worker threads
    are torn down with the interpreter and abort the exiting process ("terminate called without
    an active exception", SIGABRT; pytorch/pytorch#190489), so a finished torchrun run would
    exit as failed. Not after an error: a rank still in a collective would wait forever."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)  # it described that group


_NOTED: set[str] = set()  # notes said once per process
_EXIT_HOOK: list[bool] = []  # whether release_at_exit is registered; True once a hook saw an error


def release_at_exit() -> None:
    """Release the process group when the interpreter ends normally, for runs started from
    Python (the CLI releases it itself): a script that calls train_from_config under torchrun
    would otherwise abort at exit. After an uncaught exception it is left alone, as the CLI
    leaves it."""
    if _EXIT_HOOK:
        return
    _EXIT_HOOK.append(False)
    previous = sys.excepthook

    def note_failure(*exc: Any) -> None:
        _EXIT_HOOK[0] = True
        previous(*exc)

    sys.excepthook = note_failure
    atexit.register(lambda: None if _EXIT_HOOK[0] else release_processes())


def check_launch(train: Any, parallel: Any, world: int, main: bool = True) -> None:
    """The launch must fit the run: as many processes as train.num_processes expects.
    parallel.sharding where nothing shards (DDP) is noted once. `parallel`: the config's
    section or the plan's spec."""
    expected, single = train.num_processes, one_of_several(world)
    if expected is not None and expected != world:
        raise StackWiseError(
            f"train.num_processes (the seeds' training.num_gpus) is {expected}, but this run "
            f"has {world} process{'es' if world != 1 else ''}{single}. Launch {expected}: "
            f"`torchrun --nproc_per_node {expected} -m stackwise train --config FILE`, or "
            f"`accelerate launch --num_processes {expected} -m stackwise train --config FILE` "
            "(add --multi_gpu where there is no GPU: it also starts CPU processes); or set "
            f"train.num_processes: {world}, or remove it."
        )
    notes = {
        "sharding": parallel.sharding is not None
        and strategy_of(parallel) != "fsdp"
        and f"parallel.sharding {parallel.sharding} has no effect: it applies to FSDP "
        "(parallel.strategy: fsdp), and this run keeps a whole model on each process.",
        "single": single
        and f"this run has 1 process{single}; add --multi_gpu to start them "
        "on the CPU, or launch with torchrun --nproc_per_node N.",
    }
    for name, note in notes.items():
        if note and main and name not in _NOTED:
            _NOTED.add(name)
            print(f"stackwise: note: {note}", file=sys.stderr)


def strategy_of(parallel: Any) -> str:
    """The placement a parallel section or spec names (the launch's FSDP included)."""
    name = getattr(parallel, "name", None) or parallel.strategy
    return "fsdp" if fsdp_launch() is not None else name


def one_of_several(world: int) -> str:
    """Why a run that asked accelerate for several processes has one: without a GPU,
    `accelerate launch --num_processes N` starts one process (it sets MASTER_ADDR for N > 1,
    which a single process never reads). Empty when that is not the case."""
    env = os.environ
    launched = "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env
    if world != 1 or not launched or "WORLD_SIZE" in env:
        return ""
    return " (accelerate launch starts a single process on a machine without GPUs)"


def make_accelerator(mixed_precision: str) -> Accelerator:
    """An Accelerator with this precision, even if an earlier run in this process used another.

    Accelerate keeps its state in a process-wide singleton; progressive runs and notebooks build
    several trainers, so a precision change resets that state (the process group survives).
    """
    mixed_precision = resolve_precision(mixed_precision)  # fp16 on a CPU: auto's choice
    hide_fsdp_launch()  # FSDP2 is ours (stackwise.parallel.fsdp); Accelerate only launches
    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision", mixed_precision) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)
    # Without CUDA, Accelerate only starts DDP (gloo) under torchrun when told it runs on the CPU;
    # otherwise every rank would silently train its own copy.
    quiet_deepspeed_without_gpu()
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=not torch.cuda.is_available())
    if accelerator.num_processes > 1:
        release_at_exit()
    return accelerator


def average_gradients(model: nn.Module, acc: Accelerator) -> None:
    """What DDP does for a model it does not wrap: every rank gets the mean gradient."""
    if acc.num_processes == 1:
        return
    import torch.distributed as dist

    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= acc.num_processes


def training_device(device: Any, who: str) -> torch.device:
    """`device` when it is where this process trains (Accelerate's device, where the Trainer
    places the model); any other is refused, saying how to train there. `who`: the call."""
    try:
        wanted = torch.device(device)
    except (RuntimeError, TypeError):
        raise StackWiseError(f"{who}: not a device; give 'cpu', 'cuda' or 'cuda:N'.") from None
    here = torch.device(process_state().device)
    if wanted.type == here.type and wanted.index in (None, here.index or 0):
        return here
    if wanted.type == "cpu":
        how = "hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU"
    elif wanted.type == "cuda" and not torch.cuda.is_available():
        how = "run where a CUDA GPU is visible (torch.cuda.is_available()) to train on one"
    else:
        how = "pick the GPU with CUDA_VISIBLE_DEVICES, or launch a process per GPU (torchrun)"
    raise StackWiseError(
        f"{who}: this process trains on {here} (Accelerate's device, where the Trainer places "
        f"the model), so a model built on {wanted} would be moved away from it. Pass "
        f"device='{here}' or leave it out; or {how}."
    )
