"""The parts of a Trainer built from settings (seed 002's EnhancedTrainer and TrainerFactory):
the model adapter and training strategy a config asks for, or the ones given, checked against
the config they will train.

A config asks for the `hf` adapter when it loads a Hugging Face model (model.source: hf), for
`dialogue` when a rack trains on chat rows (data.mode: instruction), else for `standard` (the
rack). The strategy is `stackwise.strategies.strategy_for`'s (finetuning for an HF model with
LoRA or memory layers). An adapter or strategy made with sections of its own (seed 002's
`get_model_adapter("standard", model_config, training_config, device)`) lends them to a Trainer
given none, and must agree with the ones it is given.
"""

from __future__ import annotations

from typing import Any

import stackwise.hf.adapter  # noqa: F401  (registers the "hf" model adapter)
from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.hf.adapter import HFAdapter
from stackwise.strategies import check_options, get_training_strategy, strategy_for
from stackwise.train.adapters import ModelAdapter, RackAdapter, get_model_adapter
from stackwise.train.extensions import build_extensions
from stackwise.train.strategy import TrainingStrategy

__all__ = ["adapter_name", "carried_sections", "chosen_parts", "get_model_adapter"]


def adapter_name(config: Config) -> str:
    """The model adapter a config asks for."""
    if config.model.source == "hf":
        return "hf"
    return "dialogue" if config.data.mode == "instruction" else "standard"


def _plain(value: Any, section: str) -> Any:
    """A section (or a whole config's `section`) as plain data, to compare two."""
    if isinstance(value, Config):
        value = getattr(value, section)
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _carried(given: Any, part: Any, attribute: str, section: str) -> Any:
    """The trainer's `given` section, or the one `part` (an adapter or strategy) was made
    with; two that differ are refused."""
    own = getattr(part, attribute, None)
    if own is None or own is given:
        return given
    if given is None:
        return own
    if _plain(own, section) != _plain(given, section):
        kind = "model adapter" if isinstance(part, ModelAdapter) else "training strategy"
        raise StackWiseError(
            f"The {kind} was made with another {attribute} than the one this Trainer is given "
            f"(their {section} sections differ); a part trains the config it was made for. "
            f"Make it with the Trainer's {attribute}, or give the Trainer the part's."
        )
    return given


def carried_sections(
    adapter: Any, strategy: Any, model_config: Any, training_config: Any
) -> tuple[Any, Any]:
    """(model_config, training_config) for the Trainer: its own, else its parts'."""
    model_config = _carried(model_config, adapter, "model_config", "model")
    training_config = _carried(training_config, adapter, "training_config", "train")
    return model_config, _carried(training_config, strategy, "config", "train")


def _check_source(adapter: ModelAdapter, config: Config) -> None:
    source = config.model.source
    rack_on_hf = isinstance(adapter, RackAdapter) and source == "hf"
    if rack_on_hf or (isinstance(adapter, HFAdapter) and source != "hf"):
        raise StackWiseError(
            f"The '{adapter.name}' model adapter does not build this config's model "
            f"(model.source: {source}); the '{adapter_name(config)}' adapter does: "
            f"get_model_adapter('{adapter_name(config)}', ...), or leave the adapter out."
        )


def chosen_parts(
    config: Config, adapter: ModelAdapter | None, strategy: TrainingStrategy | None
) -> tuple[ModelAdapter, TrainingStrategy]:
    """The adapter and strategy (the given ones, checked, or the config's), before any data is
    read; the extensions the config names are checked first."""
    build_extensions(list(config.train.enabled_extensions))  # an unknown name: refused now
    adapter = adapter or get_model_adapter(adapter_name(config), config.model, config.train)
    _check_source(adapter, config)
    adapter.check_data(config.data)
    strategy = strategy or get_training_strategy(strategy_for(config), config.train)
    check_options(strategy, config.train.strategy_options)
    return adapter, strategy
