"""train.compile's default (None, auto): compile a rack's blocks where it pays, and say why not
where it does not.

Compiling costs once (seconds per new input shape on a CPU, with the C++ compiler inductor
needs) and then saves on every step; benchmarks/throughput.py measures both. Auto turns it on
for a single-process run of a plain rack long enough to earn the compile back, and leaves it
off, with the reason in the run's header, for everything it has not been measured on.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from torch import nn

# Regional compile of a rack cost ~32 s on 2 CPU cores the first time (inductor's C++ build,
# cold cache; seconds once cached) and saved 5-25% per step (benchmarks/RESULTS.md,
# "throughput against nanoGPT's own code"): at ~0.1 s per step, about a thousand steps.
AUTO_MIN_STEPS = 1000


@dataclass(frozen=True)
class CompileDecision:
    on: bool
    note: str  # for the run's header: what was decided, and why when auto said no


EAGER = CompileDecision(False, "eager")


def compile_decision(
    setting: bool | None, blocker: str | None, max_steps: int, processes: int, device: str
) -> CompileDecision:
    """train.compile resolved: `setting` when given; else on unless something stops it."""
    if setting is not None:
        return CompileDecision(setting, "compiled" if setting else "eager")
    reason = blocker or run_blocker(max_steps, processes, device)
    if reason:
        return CompileDecision(False, f"eager (train.compile auto: {reason})")
    return CompileDecision(True, "compiled (train.compile auto)")


def run_blocker(max_steps: int, processes: int, device: str) -> str | None:
    """Why auto does not compile this run, or None."""
    if device not in ("cpu", "cuda"):
        return f"a {device} device is not measured compiled"
    if max_steps < AUTO_MIN_STEPS:
        return f"{max_steps} steps, fewer than the {AUTO_MIN_STEPS} that earn a compile back"
    if processes > 1:
        return "a distributed run; set train.compile: true to compile each process's blocks"
    if device == "cpu" and not c_compiler():
        return "no C++ compiler (g++/clang++), which torch.compile needs on a CPU"
    return None


def c_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def rack_blocker(model: nn.Module) -> str | None:
    """Why a rack is not one auto compiles: only plain blocks (layers.plain_block: no LoRA,
    quantized linears, routed experts or memory) without activation checkpointing have been
    measured."""
    from stackwise.model.layers import Stack, plain_block

    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    if not stacks:
        return "no stacks to compile"
    if any(s.gradient_checkpointing for s in stacks):
        return "activation checkpointing recomputes the blocks eagerly"
    if not all(plain_block(b) for s in stacks for b in s.blocks):
        return "LoRA, quantized, routed-expert or memory blocks are not measured compiled"
    return None
