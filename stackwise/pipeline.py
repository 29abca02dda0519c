"""From a config to a trained, saved rack: the path `stackwise train` takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate.utils import set_seed

from stackwise.config import Config
from stackwise.data.pack import PreparedData, build_data
from stackwise.errors import StackWiseError
from stackwise.io.stack_files import save_anchor_and_manifest, save_stack
from stackwise.io.trained import build_rack
from stackwise.model.rack import Rack, count_parameters
from stackwise.objectives import build_objective
from stackwise.progressive import (
    LocalLossTrainer,
    ProgressiveResult,
    ProgressiveTrainer,
    summary_table,
)
from stackwise.train.hardware import describe_precision
from stackwise.train.state import TrainState
from stackwise.train.trainer import Trainer


@dataclass
class RunResult:
    config: Config
    output_dir: Path
    rack: Rack
    data: PreparedData
    state: TrainState | None
    trainer: Any  # Trainer, or ProgressiveTrainer (both expose .accelerator)
    progressive: ProgressiveResult | None = None


def resolve_vocab(config: Config, tokenizer_size: int) -> Config:
    """Record the vocabulary in the config so the saved run rebuilds the same shape."""
    declared = config.model.vocab_size
    if declared is not None and declared < tokenizer_size:
        raise StackWiseError(
            f"model.vocab_size={declared} is smaller than the tokenizer's {tokenizer_size} "
            "tokens. Remove model.vocab_size to take it from the tokenizer."
        )
    if declared is None:
        model = config.model.model_copy(update={"vocab_size": tokenizer_size})
        config = config.model_copy(update={"model": model})
    return config


def build_trainer(config: Config) -> Trainer:
    """The end-to-end Trainer of a config (its whole rack), e.g. for the LR finder."""
    set_seed(config.train.seed)
    data = build_data(config.data)
    config = resolve_vocab(config, len(data.tokenizer))
    rack = build_rack(config, config.model.vocab_size or len(data.tokenizer))
    objective = build_objective(config, data.specials)
    return Trainer(config, rack, objective, data.train, data.val)


def train_from_config(config: Config, quiet: bool = False) -> RunResult:
    if config.objective.name == "custom":
        raise StackWiseError(
            "objective 'custom' reads labels from the batch, and the pretraining data has none. "
            "Use the Python API (stackwise.Trainer) with a dataset that yields 'labels'."
        )
    set_seed(config.train.seed)
    data = build_data(config.data)
    config = resolve_vocab(config, len(data.tokenizer))
    if config.progressive.strategy == "progressive":
        return _train_progressive(config, data, quiet)
    rack = build_rack(config, config.model.vocab_size or len(data.tokenizer))
    objective = build_objective(config, data.specials)
    local = config.progressive.end_to_end_scope == "stackwise"
    trainer = (LocalLossTrainer if local else Trainer)(
        config, rack, objective, data.train, data.val
    )
    if not quiet and trainer.accelerator.is_main_process:
        print(
            f"StackWise: {config.objective.name} rack, {count_parameters(rack):,} parameters, "
            f"{config.model.n_stacks}x{config.model.blocks_per_stack} blocks"
            + (" (local loss per stack)" if local else "")
            + "; "
            f"{len(data.train):,} train / {len(data.val):,} val sequences of "
            f"{config.data.seq_len} tokens; device {trainer.accelerator.device}, "
            f"precision {_precision(config, trainer)}; "
            f"output {trainer.output_dir}"
        )
    state = trainer.train()
    if not quiet and trainer.accelerator.is_main_process and state.history:
        print(final_eval_line(state.history[-1]), flush=True)
    trainer.save(data.tokenizer, weights=config.progressive.save_rack)
    if config.progressive.save_stacks and trainer.accelerator.is_main_process:
        raw = trainer.accelerator.unwrap_model(trainer.model)
        save_all_stacks(getattr(raw, "_orig_mod", raw), trainer.output_dir)
    raw = trainer.accelerator.unwrap_model(trainer.model)
    rack = getattr(raw, "_orig_mod", raw)
    return RunResult(config, trainer.output_dir, rack, data, state, trainer)


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


def _precision(config: Config, trainer: Any) -> str:
    return describe_precision(config.train.mixed_precision, trainer.accelerator.device)


def save_all_stacks(rack: Rack, output_dir: Path) -> None:
    """End-to-end runs also write stacks/ (save_stacks), so any rack can be regrown from it."""
    for i, stack in enumerate(rack.stacks):
        save_stack(output_dir, i, stack, {"position": i, "precision": "full", "t_range": None})
    save_anchor_and_manifest(output_dir, rack, list(range(len(rack.stacks))))


def _train_progressive(config: Config, data: PreparedData, quiet: bool) -> RunResult:
    trainer = ProgressiveTrainer(config, data, quiet=quiet)
    p = config.progressive
    if not quiet and trainer.accelerator.is_main_process:
        print(
            f"StackWise: growing a {config.objective.name} rack to {config.model.n_stacks} "
            f"stacks of {config.model.blocks_per_stack} blocks ({p.building_mode}, trunk "
            f"{p.trunk_strategy}, head {p.head_policy}, time as {p.time_interpretation}"
            + (", activation cache" if p.cache.enabled else "")
            + (f", then {p.joint_tuning_steps} joint steps" if p.mode == "fused" else "")
            + f"); {len(data.train):,} train / {len(data.val):,} val sequences of "
            f"{config.data.seq_len} tokens; device {trainer.accelerator.device}, precision "
            f"{_precision(config, trainer)}; output {trainer.output_dir}",
            flush=True,
        )
    result = trainer.train_progressively()
    trainer.save(data.tokenizer)
    if not quiet and trainer.accelerator.is_main_process:
        print(summary_table(result), flush=True)
    return RunResult(config, trainer.output_dir, result.rack, data, None, trainer, result)
