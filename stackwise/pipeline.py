"""From a config to a trained, saved rack: the path `stackwise train` takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelerate.utils import set_seed

from stackwise.config import Config
from stackwise.data.pack import PreparedData, build_data
from stackwise.errors import StackWiseError
from stackwise.model.rack import Rack, count_parameters
from stackwise.objectives import build_objective
from stackwise.train.checkpoint import build_rack
from stackwise.train.trainer import Trainer, TrainState


@dataclass
class RunResult:
    config: Config
    output_dir: Path
    rack: Rack
    data: PreparedData
    state: TrainState
    trainer: Trainer


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


def train_from_config(config: Config, quiet: bool = False) -> RunResult:
    if config.objective.name == "custom":
        raise StackWiseError(
            "objective 'custom' reads labels from the batch, and the pretraining data has none. "
            "Use the Python API (stackwise.Trainer) with a dataset that yields 'labels'."
        )
    set_seed(config.train.seed)
    data = build_data(config.data)
    config = resolve_vocab(config, len(data.tokenizer))
    rack = build_rack(config, config.model.vocab_size or len(data.tokenizer))
    objective = build_objective(config, data.specials)
    trainer = Trainer(config, rack, objective, data.train, data.val)
    if not quiet and trainer.accelerator.is_main_process:
        print(
            f"StackWise: {config.objective.name} rack, {count_parameters(rack):,} parameters, "
            f"{config.model.n_stacks}x{config.model.blocks_per_stack} blocks; "
            f"{len(data.train):,} train / {len(data.val):,} val sequences of "
            f"{config.data.seq_len} tokens; device {trainer.accelerator.device}; "
            f"output {trainer.output_dir}"
        )
    state = trainer.train()
    trainer.save(data.tokenizer)
    raw = trainer.accelerator.unwrap_model(trainer.model)
    rack = getattr(raw, "_orig_mod", raw)
    return RunResult(config, trainer.output_dir, rack, data, state, trainer)
