"""`progressive`: grow the rack one stack at a time (and with mode fused, tune it whole)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.io.trained import save_tokenizer
from stackwise.registry import OBJECTIVES
from stackwise.strategies.base import RunResult, register_training_strategy
from stackwise.strategies.report import data_line, placement, precision, saving_note
from stackwise.train.adapters import ADAPTERS, ModelAdapter
from stackwise.train.checkpoint_manager import on_main
from stackwise.train.strategy import TrainingStrategy

if TYPE_CHECKING:  # registering the strategy imports no recipe: a plain run never builds one
    from stackwise.progressive.recipe import ProgressiveRecipe


@register_training_strategy("progressive")
class ProgressiveStrategy(TrainingStrategy):
    """Each stage trains with this strategy's step (the standard one)."""

    def run(self, plan: Any, data: PreparedData, adapter: ModelAdapter, quiet: bool) -> RunResult:
        from stackwise.progressive.recipe import ProgressiveRecipe
        from stackwise.progressive.records import summary_table

        if not ADAPTERS.capabilities_of(adapter).growable:
            raise StackWiseError(
                f"Progressive growth builds a rack stack by stack; the '{adapter.name}' model "
                "adapter cannot be grown. Use strategy 'standard', or the rack adapter."
            )
        recipe = ProgressiveRecipe(plan, data, quiet=quiet, strategy=self)
        resume = plan.train.resume_from_checkpoint  # a grown run resumes in its own folder
        on_main(
            recipe.accelerator, lambda: save_tokenizer(recipe.output_dir, data.tokenizer, resume)
        )
        if not quiet and recipe.accelerator.is_main_process:
            print(growth_header(plan, data, recipe), flush=True)
        result = recipe.train_progressively()
        recipe.save(data.tokenizer)
        if not quiet and recipe.accelerator.is_main_process:
            print(summary_table(result), flush=True)
        return RunResult(plan, recipe.output_dir, result.rack, data, None, recipe, result)


def growth_header(plan: Any, data: PreparedData, recipe: ProgressiveRecipe) -> str:
    p = plan.progressive
    return (
        f"StackWise: growing a {plan.objective.name} rack to {plan.model.n_stacks} "
        f"stacks of {blocks(plan.model.blocks_per_stack)} ({p.building_mode}, trunk "
        f"{p.trunk_strategy}, head {p.head_policy}"
        + time_note(plan)
        + (", activation cache" if p.cache.enabled else "")
        + (f", then {p.joint_tuning_steps} joint steps" if p.mode == "fused" else "")
        + f"); {data_line(data, plan)}; device {recipe.accelerator.device}"
        f"{placement(plan, recipe.accelerator)}, precision {precision(plan, recipe)}; "
        f"output {recipe.output_dir}" + saving_note(plan)
    )


def time_note(plan: Any) -> str:
    """How the stages see the noise level t: by depth, or drawn per batch, and then whether
    the rack reads it (model.time_conditioning); nothing for an objective without t."""
    if not OBJECTIVES.capabilities(plan.objective.name).uses_time:
        return ""
    if plan.progressive.time_interpretation == "depth":
        return ", time as depth"
    if plan.model.time_conditioning == "none":
        return ", every stage on every noise level, no time input"
    return f", time as input ({plan.model.time_conditioning})"


def blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


Progressive = ProgressiveStrategy
