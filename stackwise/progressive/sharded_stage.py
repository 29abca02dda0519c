"""Progressive growth under sharding (parallel.strategy: fsdp): each stage trains a sharded
copy of its model, and the grown rack takes the trained weights back, whole, when it ends.

FSDP2 turns the modules it shards into shard holders for good, while the recipe needs the rack
whole between stages: to grow the next stack from it, carry the activation cache, score and
save it. So a stage hands its parallelizer a copy. Meanwhile the plain rack waits on the CPU:
on a GPU run only the copy's shards are on the device.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from stackwise.io.sharded import gather_into
from stackwise.quant.layers import tie_4bit_weights


class StageCopies:
    """Makes a stage's working copy when the run shards, and brings its weights back."""

    def __init__(self, shards: bool, device: torch.device) -> None:
        self.shards, self.device = shards, device
        self.pair: tuple[nn.Module, nn.Module] | None = None  # (the copy's rack, the rack)

    def working(self, model: nn.Module, shared: Sequence[Any] = ()) -> Any:
        """What a stage's Trainer trains: `model` itself, or (sharding) a copy of it, the
        objects in `shared` (the activation cache) shared rather than copied."""
        if not self.shards:
            return model
        rack = part(model)
        rack.to("cpu")  # a GPU holds the copy's shards alone
        trained = copy.deepcopy(model, {id(obj): obj for obj in shared if obj is not None})
        tie_4bit_weights(trained)  # bitsandbytes' deepcopy ties them to the original layers
        self.pair = (part(trained), rack)
        return trained

    def bring_back(self) -> None:
        """The copy's trained weights gathered whole into the rack, which goes back to the
        run's device; every process calls it."""
        if self.pair is None:
            return
        trained, rack = self.pair
        gather_into(trained, rack)
        rack.to(self.device)
        self.pair = None


def part(model: nn.Module) -> nn.Module:
    """The rack inside a stage's model (what its checkpoints save), or the model itself."""
    return model.checkpoint_module() if hasattr(model, "checkpoint_module") else model
