"""Skipping a step whose loss or gradient is NaN/inf, without stopping the GPU to ask.

Deciding on the host means waiting for the backward to finish before the optimizer can even be
launched: a stall every step. torch's fused Adam(W) skips its update itself when a device flag
says so (`found_inf`, as the GradScaler drives it), so with it the verdict stays on the device;
the host reads it at its next decision point (the next update, a log line, an evaluation, a
checkpoint, the end), when it is long computed, and counts the step skipped or stops the run.

So a NaN/inf step is noticed one step late: with train.skip_nonfinite_steps off the run stops
during the next step's update (that step's forward and backward ran, its update does not), and
`skipped_steps` counts a step skipped from the next decision point on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


def device_skips(optimizer: Any) -> bool:
    """Whether this (Accelerate-wrapped) optimizer can skip an update on a device flag."""
    inner = getattr(optimizer, "optimizer", optimizer)
    groups = getattr(inner, "param_groups", [])  # a loaded state may have changed `fused`
    fused = bool(groups) and all(group.get("fused") for group in groups)
    return fused and bool(getattr(inner, "_step_supports_amp_scaling", False))


def verdict_stays_on_device(optimizer: Any, device: torch.device) -> bool:
    """On a GPU, with an optimizer that skips on a device flag. On a CPU reading the verdict
    waits for nothing, so it is read at once there, as without this module."""
    return device.type == "cuda" and device_skips(optimizer)


@dataclass
class PendingVerdicts:
    """Steps stepped with their finiteness still on the device, in order."""

    pending: list[tuple[int, torch.Tensor, Any]] = field(default_factory=list)

    def step(self, optimizer: Any, bad: torch.Tensor, step: int) -> None:
        """optimizer.step(), which leaves every parameter and moment as it was where `bad`
        (a 0-d bool on the device) is true; the verdict is copied out without waiting."""
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.found_inf = bad.float()
        try:
            optimizer.step()
        finally:
            del inner.found_inf
        host = torch.empty((), dtype=torch.bool, pin_memory=bad.is_cuda)
        host.copy_(bad, non_blocking=True)
        event = None
        if bad.is_cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append((step, host, event))

    def read(self) -> list[int]:
        """The steps (0-based), of those not read before, whose update was skipped."""
        skipped = []
        for step, host, event in self.pending:
            if event is not None:
                event.synchronize()
            if bool(host):
                skipped.append(step)
        self.pending.clear()
        return skipped
