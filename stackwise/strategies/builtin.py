"""The built-in strategies: standard end to end, local losses per stack, progressive growth."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from stackwise.config import Config
from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.io.stack_files import save_anchor_and_manifest, save_stack
from stackwise.io.trained import save_tokenizer
from stackwise.model.rack import count_parameters
from stackwise.objectives import build_objective
from stackwise.progressive import LocalLossTrainer, ProgressiveTrainer, summary_table
from stackwise.strategies.base import RunResult, TrainingStrategy, register_training_strategy
from stackwise.train.adapters import ModelAdapter, RackAdapter
from stackwise.train.checkpointer import on_main
from stackwise.train.hardware import describe_precision
from stackwise.train.trainer import Trainer


@register_training_strategy("standard")
class Standard(TrainingStrategy):
    """The whole model, end to end, one loss."""

    trainer_class: type[Trainer] = Trainer
    note = ""

    def run(
        self, config: Config, data: PreparedData, adapter: ModelAdapter, quiet: bool
    ) -> RunResult:
        model = adapter.build(config, config.model.vocab_size or len(data.tokenizer))
        objective = build_objective(config, data.specials)
        trainer = self.trainer_class(
            config, model, objective, data.train, data.val, adapter=adapter
        )
        on_main(trainer.accelerator, lambda: save_tokenizer(trainer.output_dir, data.tokenizer))
        if not quiet and trainer.accelerator.is_main_process:
            print(header(config, data, adapter, model, trainer, self.note), flush=True)
        state = trainer.train()
        if not quiet and trainer.accelerator.is_main_process and state.history:
            print(final_eval_line(state.history[-1]), flush=True)
        trained = trainer.unwrapped()
        also = adapter.final_files(trained, data.tokenizer, config)
        if also is None and config.progressive.save_stacks:
            also = partial(save_all_stacks, trained)
        trainer.save(data.tokenizer, weights=config.progressive.save_rack, also=also)
        return RunResult(config, trainer.output_dir, trained, data, state, trainer)


@register_training_strategy("local_losses")
class LocalLosses(Standard):
    """Every stack at once, each on its own detached loss (end_to_end_scope: stackwise)."""

    trainer_class = LocalLossTrainer
    note = " (local loss per stack)"


@register_training_strategy("progressive")
class Progressive(TrainingStrategy):
    """Grow the rack one stack at a time (and with mode fused, tune it whole at the end)."""

    def run(
        self, config: Config, data: PreparedData, adapter: ModelAdapter, quiet: bool
    ) -> RunResult:
        if not isinstance(adapter, RackAdapter):
            raise StackWiseError(
                f"Progressive growth builds a rack stack by stack; the '{adapter.name}' model "
                "adapter cannot be grown. Use strategy 'standard', or the rack adapter."
            )
        trainer = ProgressiveTrainer(config, data, quiet=quiet)
        on_main(trainer.accelerator, lambda: save_tokenizer(trainer.output_dir, data.tokenizer))
        p = config.progressive
        if not quiet and trainer.accelerator.is_main_process:
            print(
                f"StackWise: growing a {config.objective.name} rack to {config.model.n_stacks} "
                f"stacks of {config.model.blocks_per_stack} blocks ({p.building_mode}, trunk "
                f"{p.trunk_strategy}, head {p.head_policy}, time as {p.time_interpretation}"
                + (", activation cache" if p.cache.enabled else "")
                + (f", then {p.joint_tuning_steps} joint steps" if p.mode == "fused" else "")
                + f"); {data_line(data, config)}; device {trainer.accelerator.device}, "
                f"precision {precision(config, trainer)}; output {trainer.output_dir}"
                + saving_note(config),
                flush=True,
            )
        result = trainer.train_progressively()
        trainer.save(data.tokenizer)
        if not quiet and trainer.accelerator.is_main_process:
            print(summary_table(result), flush=True)
        return RunResult(config, trainer.output_dir, result.rack, data, None, trainer, result)


def data_line(data: PreparedData, config: Config) -> str:
    """What the run trains on, for its first line."""
    return data.describe or (
        f"{len(data.train):,} train / {len(data.val):,} val sequences of "
        f"{config.data.seq_len} tokens"
    )


def routed(config: Config) -> str:
    """The rack's routed layers, for the header: experts, memory chapters."""
    out, moe, mem = "", config.model.moe, config.memory
    if moe.num_experts:
        out += f", {moe.num_experts} experts (top-{moe.top_k})"
    if config.memory_on:
        where = ", ".join(str(i % config.model.n_layers) for i in mem.layers)
        out += (
            f", memory after block(s) {where} ({mem.chapters} chapters x "
            f"{mem.slots_per_chapter} slots, top-{mem.top_k})"
        )
    return out


def header(
    config: Config,
    data: PreparedData,
    adapter: ModelAdapter,
    model: nn.Module,
    trainer: Any,
    note: str,
) -> str:
    """The run's first line: model, data, device, precision, where it saves."""
    what = adapter.describe(model, config) or (
        f"{config.objective.name} {adapter.name}, {count_parameters(model):,} parameters, "
        f"{config.model.n_stacks}x{config.model.blocks_per_stack} blocks{note}{routed(config)}"
    )
    rows = data_line(data, config)
    return (
        f"StackWise: {what}; {rows}; device {trainer.accelerator.device}, precision "
        f"{precision(config, trainer)}; output {trainer.output_dir}" + saving_note(config)
    )


def final_eval_line(ev: dict[str, Any]) -> str:
    """The run's last evaluation in one line, bits per character included."""
    parts = [f"val loss {ev['loss']:.3f}"]
    if "nelbo" in ev:
        parts.append(f"NELBO {ev['nelbo']:.3f} nats/token")
    elif "ppl" in ev:
        parts.append(f"ppl {ev['ppl']:.2f}")
    if "bpc" in ev:
        parts.append(f"{ev['bpc']:.3f} bits per character")
    return f"final eval (step {ev.get('step', '?')}): " + ", ".join(parts)


def saving_note(config: Config) -> str:
    """What survives a crash, said before the run starts rather than after it is lost."""
    every = config.train.save_steps
    if every:
        return f"; a checkpoint every {every} steps"
    return (
        "; no periodic checkpoints (train.save_steps: 0): Ctrl-C or SIGTERM still saves one, "
        "a hard kill or power loss loses the run"
    )


def precision(config: Config, trainer: Any) -> str:
    return describe_precision(config.train.mixed_precision, trainer.accelerator.device)


def save_all_stacks(rack: nn.Module, output_dir: Path) -> None:
    """End-to-end runs also write stacks/ (save_stacks), so any rack can be regrown from it."""
    stacks = getattr(rack, "stacks", None)
    if stacks is None:
        return  # another adapter's model has no stacks to save one by one
    for i, stack in enumerate(stacks):
        save_stack(output_dir, i, stack, {"position": i, "precision": "full", "t_range": None})
    save_anchor_and_manifest(output_dir, rack, list(range(len(stacks))))  # type: ignore[arg-type]
