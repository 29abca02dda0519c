"""Where the model trains: placed by a parallelizer, with its optimizer and LR schedule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accelerate import Accelerator
from torch import nn

from stackwise.model.compiled import eager_on_compile_failure
from stackwise.registry import PARALLELIZERS
from stackwise.train.autocast import autocast_outputs
from stackwise.train.compile_policy import EAGER, CompileDecision, compile_decision
from stackwise.train.optim import build_optimizer, build_param_groups, build_scheduler

ParamGroups = dict[str, list[tuple[str, nn.Parameter]]]


@dataclass
class Placement:
    """The model as it trains (`model`: wrapped by the parallelizer, maybe compiled) and as it
    is (`raw_model`), its optimizer (Accelerate's wrapper) and LR schedule."""

    accelerator: Accelerator
    parallelizer: Any  # a registered parallelizer (stackwise.parallel)
    raw_model: nn.Module
    model: nn.Module
    optimizer: Any
    scheduler: Any
    compiling: CompileDecision = EAGER
    # puts the model's fp32 output cast back after training (train.autocast.autocast_outputs)
    restore_outputs: Callable[[], None] | None = None

    def unwrapped(self) -> nn.Module:
        """The model itself, out of its DDP/FSDP wrapper and compiled form: what is saved."""
        if self.model is self.raw_model:  # nothing wrapped it (Accelerate's unwrap would
            return self.model  # import DeepSpeed, when installed, to check: ~20 MB)
        model = self.accelerator.unwrap_model(self.model)
        return getattr(model, "_orig_mod", model)

    def checkpointed(self) -> nn.Module:
        """What a checkpoint stores: a stage's model names its own part (the rack)."""
        model = self.unwrapped()
        return model.checkpoint_module() if hasattr(model, "checkpoint_module") else model


def sharded(
    parallelizer: Any, model: nn.Module, accelerator: Accelerator, groups: ParamGroups | None
) -> tuple[nn.Module, ParamGroups | None]:
    """`model` sharded by `parallelizer`, and `groups` (given before) naming its new, sharded
    parameters (sharding keeps every parameter's name)."""
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    model = parallelizer.shard(model, accelerator)
    if groups is None:
        return model, None
    now = dict(model.named_parameters(remove_duplicate=False))
    return model, {
        group: [(label, now[names[id(p)]]) for label, p in members]
        for group, members in groups.items()
    }


def place_model(
    model: nn.Module,
    adapter: Any,
    train: Any,
    accelerator: Accelerator,
    parallelizer: Any,
    param_groups: ParamGroups | None = None,
    scheduler: Callable[[Any], Any] | None = None,
    outputs_upcast: bool = False,
) -> Placement:
    """The optimizer over the parameter groups (the adapter's, or `param_groups`), the model
    and optimizer placed by `parallelizer`, and the LR schedule (`scheduler(optimizer)`
    replaces the train spec's). `outputs_upcast`: every reader of the model's outputs upcasts
    them itself, so they stay in the autocast dtype while training."""
    if hasattr(parallelizer, "shard"):  # sharding replaces the parameters: before the optimizer
        model, param_groups = sharded(parallelizer, model, accelerator, param_groups)
    groups = param_groups if param_groups is not None else adapter.named_groups(model)
    shards = PARALLELIZERS.capabilities_of(parallelizer).shards  # FSDP2, DeepSpeed
    optimizer_groups = build_param_groups(groups, train, adapter.group_lr)
    optimizer = build_optimizer(optimizer_groups, train, fused_may=not shards)
    blocker = "a sharded run (FSDP2, DeepSpeed) is not measured compiled" if shards else None
    compiling = compile_decision(
        train.compile,
        blocker or (adapter.compile_blocker(model) if train.compile is None else None),
        train.max_steps,
        accelerator.num_processes,
        accelerator.device.type,
    )
    placed = adapter.compile(model) if compiling.on else model
    if compiling.on and train.compile is None:  # auto: a compiler failing here is not fatal
        eager_on_compile_failure(model)
    prepared = placed
    placed, optimizer = parallelizer.place(placed, optimizer, accelerator)
    # readers that upcast the logits themselves: no fp32 copy of them (train.autocast)
    restore = autocast_outputs(prepared, accelerator) if outputs_upcast else None
    inner = optimizer.optimizer
    schedule = scheduler(inner) if scheduler else build_scheduler(inner, train)
    return Placement(
        accelerator, parallelizer, model, placed, optimizer, schedule, compiling, restore
    )
