"""Builders: the Trainer's parts, made from the run's Plan and handed in.

`build_trainer` is what every recipe calls (a standard run, each progressive stage, the LR
finder): it makes the accelerator, claims the run folder, places the model with its optimizer,
binds the strategy's step, and assembles the EnhancedTrainer. Each part can be built alone too,
for a Trainer assembled by hand.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from torch import nn
from torch.utils.data import Dataset

from stackwise.errors import StackWiseError
from stackwise.objectives.base import Objective
from stackwise.registry import PARALLELIZERS
from stackwise.train import best
from stackwise.train.adapters import ModelAdapter, RackAdapter
from stackwise.train.autocast import readers_upcast
from stackwise.train.checkpoint_manager import CheckpointManager
from stackwise.train.evaluation import Evaluator
from stackwise.train.extensions import Extension, ExtensionManager, build_extensions
from stackwise.train.hardware import check_launch, keep_freed_memory, make_accelerator
from stackwise.train.metrics import MetricsLogger
from stackwise.train.placement import ParamGroups, place_model
from stackwise.train.run_dir import claim_output_dir, run_dir_of
from stackwise.train.sampler import TrainingData
from stackwise.train.state import Stage
from stackwise.train.strategy import STRATEGY_FAMILY, StepContext, TrainingStrategy
from stackwise.train.trainer import EnhancedTrainer, RunData


def extension_manager(plan: Any, extra: Sequence[Extension] = ()) -> ExtensionManager:
    """The extensions the plan turns on (best model, early stopping, enabled_extensions),
    then `extra` (given in code)."""
    user = build_extensions(list(plan.train.enabled_extensions))  # unknown names: fail first
    return ExtensionManager(best.builtin_extensions(plan) + user + list(extra))


def accelerator_for(plan: Any) -> Accelerator:
    acc = make_accelerator(plan.train.mixed_precision)
    check_launch(plan.train, plan.parallel, acc.num_processes, acc.is_main_process)
    if acc.device.type == "cpu":
        keep_freed_memory()
    return acc


def check_placement(chosen: str, strategy: TrainingStrategy) -> str:
    """The parallelizer to place the model with: the user's (`chosen`), else the one the
    strategy declares it needs, else DDP. A strategy whose step runs several backward passes
    (local losses) needs an unwrapped model: a wrapping choice is refused."""
    needed = STRATEGY_FAMILY.capabilities_of(strategy).parallelizer
    if chosen == "auto":
        return needed or "ddp"
    if needed and PARALLELIZERS.capabilities(chosen, "parallel.strategy").wraps_model:
        raise StackWiseError(
            f"parallel.strategy is '{chosen}', but the '{strategy.name}' strategy places its "
            f"model with '{needed}' (its step runs several backward passes, which a wrapped "
            "model does not allow). Remove parallel.strategy (auto picks it), or name one "
            "that leaves the model unwrapped."
        )
    return chosen


def parallelizer_for(plan: Any, strategy: TrainingStrategy) -> Any:
    """The parallelizer the plan names, or the strategy's own when the plan says auto."""
    chosen = plan.parallel
    name = check_placement(chosen.name if chosen.chosen else "auto", strategy)
    parallelizer = PARALLELIZERS.create(name, where="parallel.strategy")
    if hasattr(parallelizer, "configure"):
        parallelizer.configure(plan.parallel)
    return parallelizer


def loss_compiles(compiling: bool, device: str) -> bool:
    """Whether the training loss is compiled with the model: on GPUs (4.4x faster than the old
    path on an H200 at GPT-2's logits); a CPU run keeps it eager, where the compiled one was
    slower (benchmarks/RESULTS.md, gpu_loss_paths)."""
    return compiling and device == "cuda"


def bind_step(
    strategy: TrainingStrategy,
    placement: Any,
    adapter: ModelAdapter,
    objective: Objective,
    plan: Any,
) -> None:
    strategy.bind(
        StepContext(
            accelerator=placement.accelerator,
            adapter=adapter,
            objective=objective,
            train=plan.train,
            parallelizer=placement.parallelizer,
            raw_model=placement.raw_model,
            uses_time=bool(getattr(placement.raw_model, "uses_time", False)),
            length_ratio=plan.objective.random_length_ratio,
        )
    )


def run_data(
    plan: Any,
    acc: Accelerator,
    adapter: ModelAdapter,
    train_data: Dataset,
    val_data: Dataset | None,
    scored: Objective,
    eval_seed: int | None,
) -> RunData:
    """The batches this rank trains on, and the evaluator of the validation data."""
    tc = plan.train
    train = TrainingData(
        train_data, tc, plan.data.num_workers, acc.process_index, acc.num_processes
    )
    seed = tc.seed if eval_seed is None else eval_seed
    return RunData(train, Evaluator(val_data, scored, seed, adapter, tc))


def build_trainer(
    plan: Any,
    model: nn.Module,
    objective: Objective,
    train_data: Dataset,
    val_data: Dataset | None = None,
    *,
    adapter: ModelAdapter | None = None,
    strategy: TrainingStrategy | None = None,
    extensions: Sequence[Extension] = (),
    accelerator: Accelerator | None = None,
    output_dir: str | Path | None = None,
    stage: Stage | None = None,
    eval_objective: Objective | None = None,
    eval_seed: int | None = None,
    param_groups: ParamGroups | None = None,
    scheduler: Callable[[Any], Any] | None = None,
) -> EnhancedTrainer:
    """A Trainer of `model` on `train_data` for `plan`. `eval_objective` (default: the
    training one) is what evaluation scores, with masks seeded by `eval_seed` (default
    train.seed); `scheduler(optimizer)` replaces the plan's LR schedule."""
    adapter = adapter or RackAdapter()
    # each Trainer binds its own copy: one strategy object may serve several (the stages)
    strategy = copy.copy(strategy or TrainingStrategy())
    tc = plan.train
    ext = extension_manager(plan, extensions)
    acc = accelerator or accelerator_for(plan)
    out = claim_output_dir(acc, plan, run_dir_of(plan, output_dir))
    parallelizer = parallelizer_for(plan, strategy)
    strategy.prepare_model(model, adapter)
    upcast = readers_upcast(adapter, strategy, ext.extensions)
    placement = place_model(
        model, adapter, tc, acc, parallelizer, param_groups, scheduler, outputs_upcast=upcast
    )
    scored = eval_objective or objective
    if loss_compiles(placement.compiling.on, acc.device.type):
        objective = objective.fused(fallback=tc.compile is None)
    bind_step(strategy, placement, adapter, objective, plan)
    data = run_data(plan, acc, adapter, train_data, val_data, scored, eval_seed)
    checkpoints = CheckpointManager(acc, out, tc.save_total_limit)
    metrics = MetricsLogger.from_plan(plan)
    return EnhancedTrainer(
        plan, adapter, strategy, placement, data, ext, checkpoints, metrics, stage
    )
