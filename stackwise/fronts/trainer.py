"""`Trainer(config)`, `Trainer(config, model=model)` (seed 001) and `EnhancedTrainer(model_config=
..., training_config=..., data_config=..., model_adapter=..., training_strategy=...)` (seed 002):
the real EnhancedTrainer, its parts built from the config the way `stackwise train` builds them.
Importing this module registers the builder with the class."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from stackwise.config import Config, from_dict
from stackwise.errors import StackWiseError
from stackwise.fronts.components import carried_sections, chosen_parts
from stackwise.io.lock import release_run_folder
from stackwise.io.trained import save_tokenizer
from stackwise.objectives import objective_from
from stackwise.pipeline import prepared
from stackwise.strategies.standard import save_trained
from stackwise.train import settings_call
from stackwise.train.builders import build_trainer
from stackwise.train.checkpoint_manager import on_main
from stackwise.train.trainer import EnhancedTrainer, Trainer

__all__ = ["EnhancedTrainer", "Trainer", "trainer_from_settings"]


def trainer_from_settings(
    config: Config | None = None,
    model: nn.Module | None = None,
    *,
    model_config: Any = None,
    training_config: Any = None,
    data_config: Any = None,
    model_adapter: Any = None,
    training_strategy: Any = None,
) -> EnhancedTrainer:
    """The Trainer of `config` (or of its sections given one by one), on `model` when given,
    else on the model the config describes."""
    model_config, training_config = carried_sections(
        model_adapter, training_strategy, model_config, training_config
    )
    if config is None and training_config is None and model_config is None:
        raise StackWiseError(
            "Trainer needs a config: Trainer(config) with a config from stackwise.load_config("
            "FILE), or EnhancedTrainer(model_config=..., training_config=..., data_config=...)."
        )
    return trainer_of_settings(
        config,
        model,
        model_config=model_config,
        training_config=training_config,
        data_config=data_config,
        adapter=model_adapter,
        strategy=training_strategy,
    )


def config_of_sections(
    config: Config | None, model_config: Any, training_config: Any, data_config: Any
) -> Config:
    """One validated config from a whole one and/or sections: a `training_config` may be a
    whole config (seed 000/004's TrainingConfig) or the train section."""
    base = config if config is not None else Config()
    if isinstance(training_config, Config) and config is not None:
        raise StackWiseError(
            "Give the Trainer one whole config: `config` or a whole `training_config` (a "
            "TrainingConfig), not both; pass sections (model_config, data_config) beside it."
        )
    if isinstance(training_config, Config):
        base = training_config
        training_config = None
    parts = {"model": model_config, "train": training_config, "data": data_config}
    data = base.model_dump(mode="json")
    for name, section in parts.items():
        if section is not None:
            data[name] = (
                section.model_dump(mode="json") if hasattr(section, "model_dump") else (section)
            )
    return from_dict(data, "the Trainer's config")


def trainer_of_settings(
    config: Config | None,
    model: nn.Module | None,
    *,
    model_config: Any = None,
    training_config: Any = None,
    data_config: Any = None,
    adapter: Any = None,
    strategy: Any = None,
) -> EnhancedTrainer:
    config = config_of_sections(config, model_config, training_config, data_config)
    if config.progressive.strategy == "progressive":
        raise StackWiseError(
            "This config grows the model stack by stack (progressive.strategy: progressive); a "
            "Trainer trains one model end to end. Use ProgressiveTrainer(config)."
            "train_progressively(...) or `stackwise train --config FILE`, or set "
            "progressive.strategy: end_to_end."
        )
    adapter, chosen = chosen_parts(config, adapter, strategy)
    plan, data = prepared(config)
    if model is None:
        model = adapter.new_model(plan, plan.model.vocab_size or len(data.tokenizer))
    elif hasattr(adapter, "adopt"):  # a model built apart (MemoryAdapter(config)): learn it
        adapter.adopt(model, plan)
    objective = objective_from(plan.objective, plan.masking, data.specials)
    trainer = build_trainer(
        plan, model, objective, data.train, data.val, adapter=adapter, strategy=chosen
    )
    resume = plan.train.resume_from_checkpoint
    on_main(trainer.accelerator, lambda: save_tokenizer(trainer.output_dir, data.tokenizer, resume))
    trainer.save_when_trained = partial(saved_and_released, trainer, data, adapter)
    return trainer


def saved_and_released(trainer: EnhancedTrainer, data: Any, adapter: Any) -> None:
    """What train() leaves in output_dir, as `stackwise train` does: the finished run (weights
    in train.save_precision, config.yaml, tokenizer/, history.json); the folder is freed."""
    save_trained(trainer, data, adapter)
    release_run_folder(trainer.output_dir)


if not settings_call.SEED_FRONT:
    settings_call.SEED_FRONT.append(trainer_from_settings)
