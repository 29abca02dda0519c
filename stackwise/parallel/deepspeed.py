"""`deepspeed`: DeepSpeed ZeRO-2/3 through `deepspeed.initialize` directly (not Accelerate,
which runs DDP instead on a CPU).

The engine partitions the optimizer state and gradients (ZeRO-2) and the parameters too
(ZeRO-3) over the processes; it counts micro-batches, reduces gradients at the step's last one,
clips and steps. The trainer's loop stays the same: backward goes through the engine, the
optimizer it holds is the engine's (`EngineOptimizer`), and the LR schedule drives the torch
optimizer inside it. Checkpoints are the engine's own (stackwise.io.deepspeed_files).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.parallel.fsdp import one_process_group
from stackwise.registry import register_parallelizer
from stackwise.train.autocast import autocast_forward


class EngineOptimizer:
    """The optimizer a trainer holds: stepping and zeroing are the engine's (it steps only at
    the accumulation boundary, after clipping); `optimizer` is the torch optimizer inside,
    whose param_groups the engine reads, so the LR schedule works on it."""

    def __init__(self, engine: Any, optimizer: torch.optim.Optimizer) -> None:
        self.engine, self.optimizer = engine, optimizer

    def step(self) -> bool:
        """The engine's step at the accumulation boundary; False when it skipped the update
        (a non-finite gradient norm)."""
        self.engine.step()
        return bool(self.engine.was_step_applied())

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups


@register_parallelizer("deepspeed", wraps_model=True, shards=True)
class DeepSpeed:
    steps_itself = True  # backward, accumulation and clipping are the engine's

    def __init__(self) -> None:
        self.spec: Any = None

    def configure(self, spec: Any) -> None:
        """The plan's ParallelSpec: its `deepspeed` holds the config initialize gets."""
        self.spec = spec

    def place(self, model: nn.Module, optimizer: Any, accelerator: Any) -> tuple[Any, Any]:
        import deepspeed
        from deepspeed.utils import logger

        logger.setLevel(logging.WARNING)  # StackWise reports the run itself
        config = dict(self.spec.deepspeed)
        check_world(config, accelerator.num_processes)
        if self.spec.cpu_offload and accelerator.device.type == "cpu":
            config["zero_optimization"] = {
                k: v
                for k, v in config["zero_optimization"].items()
                if k not in ("offload_optimizer", "offload_param")
            }
            if accelerator.is_main_process:
                print(
                    "stackwise: note: parallel.cpu_offload moves ZeRO's partitions to the CPU, "
                    "where this run already trains: it changes nothing here.",
                    file=sys.stderr,
                )
        if accelerator.mixed_precision != "no":
            autocast_forward(model, accelerator)
        if accelerator.num_processes == 1:  # no launcher: ZeRO still needs a group and rank
            one_process_group(accelerator.device)
            os.environ.setdefault("LOCAL_RANK", "0")
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
        return engine, EngineOptimizer(engine, optimizer)

    def backward(self, model: Any, loss: torch.Tensor, last: bool) -> None:
        """The engine's backward (the loss is already scaled for accumulation). The step's
        boundary is the trainer's (its last micro-batch), told to the engine rather than left
        to the engine's own counter; the engine steps once, after it (EngineOptimizer.step)."""
        model.set_gradient_accumulation_boundary(last)
        model.backward(loss, scale_wrt_gas=False)

    def sync_gradients(self, raw_model: nn.Module, accelerator: Any) -> None:
        """Nothing to do: the engine reduces them at the accumulation boundary."""


def check_world(config: dict[str, Any], world: int) -> None:
    """A train_batch_size the file gives must be this run's global batch."""
    size = config.get("train_batch_size")
    expected = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
    if size not in (None, "auto") and size != expected * world:
        raise StackWiseError(
            f"The DeepSpeed config sets train_batch_size: {size}, and this run's global batch "
            f"is {expected * world} (train.batch_size x train.grad_accum_steps x {world} "
            'processes). Set train_batch_size to "auto" or remove it.'
        )
