"""`TrainerFactory().create_trainer(model_config, training_config, data_config)` (seed 002): the
EnhancedTrainer of those sections, its parts chosen from them as `stackwise train` chooses
them: the model adapter by model.source and data.mode (stackwise.fronts.components), the
strategy by the progressive and model sections (finetuning for an HF model with LoRA or
memory), the extensions by train.enabled_extensions."""

from __future__ import annotations

from typing import Any

from stackwise.errors import StackWiseError
from stackwise.fronts.components import adapter_name, chosen_parts
from stackwise.fronts.trainer import config_of_sections, trainer_of_settings
from stackwise.strategies import strategy_for
from stackwise.train.trainer import EnhancedTrainer

__all__ = ["TrainerFactory"]


class TrainerFactory:
    """Makes Trainers from config sections: `model_config`, `training_config`, `data_config`
    are a config's model, train and data sections (or dicts of them); `training_config` may
    also be a whole config (stackwise.TrainingConfig, stackwise.load_config(FILE))."""

    def create_trainer(
        self, model_config: Any = None, training_config: Any = None, data_config: Any = None
    ) -> EnhancedTrainer:
        """The Trainer, its model built and placed; `train()` runs and saves it."""
        if model_config is None and training_config is None and data_config is None:
            raise StackWiseError(
                "TrainerFactory().create_trainer(model_config, training_config, data_config) "
                "needs the config sections to train (config.model, config.train, config.data of "
                "a stackwise.load_config(FILE)), or a whole config as training_config."
            )
        config = config_of_sections(None, model_config, training_config, data_config)
        adapter, strategy = chosen_parts(config, None, None)
        return trainer_of_settings(config, None, adapter=adapter, strategy=strategy)

    @staticmethod
    def components(model_config: Any, training_config: Any, data_config: Any) -> dict[str, str]:
        """The names of the parts `create_trainer` would choose, without building anything."""
        config = config_of_sections(None, model_config, training_config, data_config)
        return {
            "model_adapter": adapter_name(config),
            "training_strategy": strategy_for(config),
            "extensions": ", ".join(config.train.enabled_extensions) or "none",
        }
