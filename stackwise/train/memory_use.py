"""The `memory` extension: `train.enabled_extensions: [memory]` builds the memory layers (the
adapters read the switch) and this follows how the run uses their chapters.

Each step it adds every memory layer's chapter shares (of this process's last micro-batch) to
a running total, kept in the extension's checkpointed state, so a resumed run goes on counting.
trainer_state.json reports each layer's mean chapter shares over the run, and the end of the
run says how evenly they were used and which chapters no token read.
"""

from __future__ import annotations

from typing import Any

import torch

from stackwise.model.memory import memory_layers
from stackwise.train.extensions import Extension, register_extension
from stackwise.train.state import RunInfo


@register_extension("memory")
class MemoryUse(Extension):
    name = "memory"

    def __init__(self) -> None:
        # per memory layer, per chapter: summed shares, kept where the model runs (no device
        # sync each step); read back when saved, reported or summed up
        self.sums: list[torch.Tensor] = []
        self.where: list[int | None] = []  # the block / decoder layer each follows
        self.steps = 0

    def on_step_end(self, run: RunInfo) -> None:
        model = run.model
        layers = [m for m in memory_layers(model) if m.last_routing is not None] if model else []
        if not layers:
            return
        shares = [m.last_stats["fraction"].detach() for m in layers]
        if not self.sums:
            self.sums = [torch.zeros_like(s) for s in shares]
            self.where = [m.where for m in layers]
        self.sums = [t.to(s.device) + s for t, s in zip(self.sums, shares, strict=True)]
        self.steps += 1

    @property
    def totals(self) -> list[list[float]]:
        return [s.tolist() for s in self.sums]

    def shares(self) -> list[list[float]]:
        """Each layer's mean chapter shares over the steps counted so far."""
        return [[t / max(self.steps, 1) for t in total] for total in self.totals]

    def on_train_end(self, run: RunInfo) -> None:
        names = self.where if len(self.where) == len(self.sums) else range(len(self.sums))
        for i, share in zip(names, self.shares(), strict=True):
            mean = sum(share) / len(share)
            cv = (sum((s - mean) ** 2 for s in share) / len(share)) ** 0.5 / mean
            unused = [c for c, s in enumerate(share) if s == 0.0]
            listed = ", ".join(map(str, unused[:8])) + (", ..." if len(unused) > 8 else "")
            run.note(
                f"memory after layer {i}: chapter load CV {cv:.2f} over {self.steps} steps, "
                + (
                    f"{len(unused)} of {len(share)} chapters never read ({listed})"
                    if unused
                    else "every chapter read"
                )
            )

    def report(self) -> dict[str, Any]:
        return {"memory_chapter_shares": self.shares()}

    def state_dict(self) -> dict[str, Any]:
        return {"totals": self.totals, "where": self.where, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums = [torch.tensor(t, dtype=torch.float32) for t in state.get("totals", [])]
        self.where = list(state.get("where", []))
        self.steps = int(state.get("steps", 0))
