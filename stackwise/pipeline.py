"""From a config to a trained, saved rack: the path `stackwise train` takes."""

from __future__ import annotations

from accelerate.utils import set_seed

from stackwise.config import Config
from stackwise.data.pack import build_data
from stackwise.errors import StackWiseError
from stackwise.io.lock import release_run_folder
from stackwise.objectives import build_objective
from stackwise.strategies import RunResult, get_training_strategy, strategy_for
from stackwise.train.adapters import RackAdapter, get_model_adapter
from stackwise.train.run_dir import precheck_run_dir
from stackwise.train.trainer import Trainer


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


def with_hf_shape(config: Config) -> Config:
    """model.init_from_hf: the rack takes the checkpoint's shape and tokenizer."""
    if not config.model.init_from_hf:
        return config
    from stackwise.config import derive
    from stackwise.io.hf_llama import init_changes

    return derive(config, init_changes(config), "model.init_from_hf")


def build_trainer(config: Config) -> Trainer:
    """The end-to-end Trainer of a config (its whole rack), e.g. for the LR finder."""
    config = with_hf_shape(config)
    set_seed(config.train.seed)
    data = build_data(config.data)
    config = resolve_vocab(config, len(data.tokenizer))
    rack = RackAdapter().build(config, config.model.vocab_size or len(data.tokenizer))
    objective = build_objective(config, data.specials)
    return Trainer(config, rack, objective, data.train, data.val)


def train_from_config(
    config: Config, quiet: bool = False, strategy: str | None = None, adapter: str = "rack"
) -> RunResult:
    """Prepare the data and train with `strategy` (default: the one the config asks for,
    see stackwise.strategies.strategy_for) on the model `adapter` builds."""
    if config.objective.name == "custom":
        raise StackWiseError(
            "objective 'custom' reads labels from the batch, and the pretraining data has none. "
            "Use the Python API (stackwise.Trainer) with a dataset that yields 'labels'."
        )
    chosen = get_training_strategy(strategy or strategy_for(config))  # unknown: fail first
    model_adapter = get_model_adapter(adapter)
    config = with_hf_shape(config)
    precheck_run_dir(config)  # before the data: a refused run is refused at once
    set_seed(config.train.seed)
    data = build_data(config.data)
    config = resolve_vocab(config, len(data.tokenizer))
    result = chosen.run(config, data, model_adapter, quiet)
    release_run_folder(result.output_dir)  # finished: the next run may take the folder quietly
    return result
