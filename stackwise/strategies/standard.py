"""`standard`: the whole model, end to end, one loss; the recipe local losses shares."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from stackwise.data.pack import PreparedData
from stackwise.io.sharded import whole_model
from stackwise.io.trained import save_tokenizer
from stackwise.objectives import objective_from
from stackwise.strategies.base import RunResult, register_training_strategy
from stackwise.strategies.report import final_eval_line, header, save_all_stacks
from stackwise.train.adapters import ModelAdapter
from stackwise.train.builders import build_trainer
from stackwise.train.checkpoint_manager import on_main
from stackwise.train.strategy import TrainingStrategy


def run_end_to_end(
    strategy: TrainingStrategy,
    plan: Any,
    data: PreparedData,
    adapter: ModelAdapter,
    quiet: bool,
    note: str = "",
) -> RunResult:
    """Build the model, train it with `strategy`'s step, save the run."""
    model = adapter.build(plan, plan.model.vocab_size or len(data.tokenizer))
    objective = objective_from(plan.objective, plan.masking, data.specials)
    trainer = build_trainer(
        plan, model, objective, data.train, data.val, adapter=adapter, strategy=strategy
    )
    resume = plan.train.resume_from_checkpoint
    on_main(trainer.accelerator, lambda: save_tokenizer(trainer.output_dir, data.tokenizer, resume))
    main = not quiet and trainer.accelerator.is_main_process
    if main:
        print(header(plan, data, adapter, model, trainer, note), flush=True)
    state = trainer.train()
    if main and state.history:
        print(final_eval_line(state.history[-1]), flush=True)
    trained = save_trained(trainer, data, adapter)
    return RunResult(plan, trainer.output_dir, trained, data, state, trainer)


def save_trained(trainer: Any, data: PreparedData, adapter: ModelAdapter) -> nn.Module:
    """The finished run's folder: the weights (train.save_precision), the adapter's own files
    or the stacks, config.yaml, tokenizer/ and history.json, marked complete. Returns the
    trained model, whole (a sharded run's gathered onto the main process)."""
    plan = trainer.plan
    vocab = plan.model.vocab_size or len(data.tokenizer)
    main = trainer.accelerator.is_main_process
    trained = whole_model(trainer.unwrapped(), lambda: adapter.build(plan, vocab), main)
    also = adapter.final_files(trained, data.tokenizer, plan)
    if also is None and plan.progressive.save_stacks:
        also = partial(save_all_stacks, trained)
    trainer.save(data.tokenizer, weights=plan.progressive.save_rack, also=also, model=trained)
    return trained


@register_training_strategy("standard")
class StandardTrainingStrategy(TrainingStrategy):
    """The whole model, end to end, one loss (the standard step)."""

    def run(self, plan: Any, data: PreparedData, adapter: ModelAdapter, quiet: bool) -> RunResult:
        return run_end_to_end(self, plan, data, adapter, quiet)


Standard = StandardTrainingStrategy


def run_strategy(
    strategy: TrainingStrategy, plan: Any, data: PreparedData, adapter: ModelAdapter, quiet: bool
) -> RunResult:
    """`strategy`'s recipe; a strategy that defines only its step (a user's, subclassing
    TrainingStrategy) trains the whole model end to end with it."""
    if type(strategy).run is TrainingStrategy.run:
        return run_end_to_end(strategy, plan, data, adapter, quiet)
    return strategy.run(plan, data, adapter, quiet)
