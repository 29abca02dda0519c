"""From a config to a trained, saved rack: the path `stackwise train` takes."""

from __future__ import annotations

import math
from typing import Any

from accelerate.utils import set_seed

from stackwise.config import Config
from stackwise.data.pack import PreparedData, build_data
from stackwise.data.tokenizer import make_tokenizer
from stackwise.errors import StackWiseError
from stackwise.io.lock import release_run_folder
from stackwise.objectives import build_objective
from stackwise.strategies import RunResult, get_training_strategy, strategy_for
from stackwise.train.adapters import get_model_adapter
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
    if declared is None:  # a fill-in that cannot break a rule: no need to validate again
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


def adapter_for(config: Config) -> str:
    """The adapter a config's model.source asks for (registering the hf one on first use)."""
    if config.model.source == "hf":
        import stackwise.hf.adapter  # noqa: F401  (registers "hf")

        return "hf"
    return "rack"


def with_hf_source(config: Config) -> Config:
    """A local model dir recorded as an absolute path, so the run folder loads from anywhere."""
    from stackwise.config import derive
    from stackwise.hf.load import source_path

    path = source_path(config.model.model_name_or_path or "")
    if path == config.model.model_name_or_path:
        return config
    return derive(config, {"model.model_name_or_path": path}, "model.model_name_or_path")


def with_epochs(config: Config, n_rows: int) -> Config:
    """train.num_train_epochs: max_steps from the number of training rows."""
    tc = config.train
    if tc.num_train_epochs is None:
        return config
    from stackwise.config import derive
    from stackwise.train.hardware import process_state

    per_step = tc.batch_size * tc.grad_accum_steps * process_state().num_processes
    steps = max(1, math.ceil(tc.num_train_epochs * n_rows / per_step))
    changes = {"train.max_steps": steps, "train.num_train_epochs": None}
    return derive(config, changes, "train.num_train_epochs")


def instruction_tokenizer(config: Config) -> Any:
    """The tokenizer instruction rows are rendered with: the HF model's, or a rack's
    data.tokenizer (a local dir, or byte)."""
    m, d = config.model, config.data
    if m.source == "hf":
        from stackwise.hf.load import load_tokenizer

        return load_tokenizer(m.model_name_or_path or "", m.trust_remote_code)
    return make_tokenizer(d.tokenizer, [], d.bpe_vocab_size, d.cache_dir)


def prepared(config: Config) -> tuple[Config, PreparedData]:
    """The config as the run will use it (an HF source made absolute, an imported shape, the
    vocabulary, epochs as steps), and its data; the run folder is checked before the data."""
    if config.model.source == "hf":
        config = with_hf_source(config)
    config = with_hf_shape(config)
    precheck_run_dir(config)  # before the data: a refused run is refused at once
    set_seed(config.train.seed)
    if config.data.mode == "instruction":
        from stackwise.chat.build import build_chat_data

        tok = instruction_tokenizer(config)
        data = build_chat_data(config, tok)
        if config.model.source == "rack":
            config = resolve_vocab(config, len(tok))
    else:
        data = build_data(config.data)
        config = resolve_vocab(config, len(data.tokenizer))
    return with_epochs(config, data.train_size), data


def build_trainer(config: Config) -> Trainer:
    """The end-to-end Trainer of a config (its whole model), e.g. for the LR finder."""
    adapter = get_model_adapter(adapter_for(config))
    config, data = prepared(config)
    model = adapter.build(config, config.model.vocab_size or len(data.tokenizer))
    objective = build_objective(config, data.specials)
    return Trainer(config, model, objective, data.train, data.val, adapter=adapter)


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
    model_adapter = get_model_adapter(adapter_for(config) if adapter == "rack" else adapter)
    config, data = prepared(config)
    result = chosen.run(config, data, model_adapter, quiet)
    release_run_folder(result.output_dir)  # finished: the next run may take the folder quietly
    return result
