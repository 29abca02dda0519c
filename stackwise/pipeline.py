"""From a config to a trained, saved run: the door `stackwise train` and the Python API take.

The config is settled here (an HF source made absolute, an imported shape, the vocabulary),
the data prepared, and the whole is compiled once into the run's frozen Plan
(stackwise.plan); everything below works from the Plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import Dataset

from stackwise.config import Config, derive
from stackwise.data.pack import PreparedData, build_data
from stackwise.data.tokenizer import make_tokenizer
from stackwise.errors import StackWiseError
from stackwise.io.lock import release_run_folder
from stackwise.objectives import Objective, objective_from
from stackwise.plan import compile_plan
from stackwise.progressive.timing import TimeMapping
from stackwise.registry import OBJECTIVES
from stackwise.spec import Plan
from stackwise.strategies import RunResult, check_options, get_training_strategy, strategy_for
from stackwise.strategies.standard import run_strategy
from stackwise.train.adapters import get_model_adapter
from stackwise.train.builders import build_trainer, check_placement
from stackwise.train.extensions import Extension
from stackwise.train.hardware import check_launch, process_state
from stackwise.train.run_dir import precheck_run_dir
from stackwise.train.trainer import EnhancedTrainer

if TYPE_CHECKING:  # a plain run imports no progressive recipe (its builder, growth, quant)
    from stackwise.progressive.recipe import ProgressiveRecipe


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
    from stackwise.io.hf_llama import init_changes

    return derive(config, init_changes(config), "model.init_from_hf")


def adapter_for(config: Any) -> str:
    """The adapter a config's model.source asks for (registering the hf one on first use)."""
    if config.model.source == "hf":
        import stackwise.hf.adapter  # noqa: F401  (registers "hf")

        return "hf"
    return "rack"


def with_hf_source(config: Config) -> Config:
    """A local model dir recorded as an absolute path, so the run folder loads from anywhere."""
    from stackwise.hf.load import source_path

    path = source_path(config.model.model_name_or_path or "")
    if path == config.model.model_name_or_path:
        return config
    return derive(config, {"model.model_name_or_path": path}, "model.model_name_or_path")


def instruction_tokenizer(config: Any) -> Any:
    """The tokenizer instruction rows are rendered with: the HF model's, or a rack's
    data.tokenizer (a local dir, or byte)."""
    m, d = config.model, config.data
    if m.source == "hf":
        from stackwise.hf.load import load_tokenizer

        return load_tokenizer(m.model_name_or_path or "", m.trust_remote_code)
    return make_tokenizer(d.tokenizer, [], d.bpe_vocab_size, d.cache_dir)


def prepared(config: Config, time_mapping: TimeMapping | None = None) -> tuple[Plan, PreparedData]:
    """The run's Plan and its data. The config is settled first (an HF source made absolute,
    an imported shape, the vocabulary); the run folder is checked before the data."""
    if config.data.mode == "instruction" and not (
        config.data.files or config.data.dataset_dir or config.data.dataset_name
    ):
        raise StackWiseError(
            "This run trains on instruction rows but names none: set data.files (or "
            "data.dataset_dir, data.dataset_name); `stackwise finetune` takes --train_file "
            "FILE, and ModelTrainer takes train(train_file=FILE)."
        )
    if config.model.source == "hf":
        config = with_hf_source(config)
    config = with_hf_shape(config)
    precheck_run_dir(config)  # before the data: a refused run is refused at once
    state = process_state()
    check_launch(config.train, config.parallel, state.num_processes, state.is_main_process)
    set_seed(config.train.seed)
    if config.data.mode == "instruction":
        from stackwise.chat.build import build_chat_data

        tok = instruction_tokenizer(config)
        data = build_chat_data(compile_plan(config), tok)
        if config.model.source == "rack":
            config = resolve_vocab(config, len(tok))
    else:
        data = build_data(compile_plan(config).data)
        config = resolve_vocab(config, len(data.tokenizer))
    return plan_for(config, data.train_size, time_mapping), data


def plan_for(config: Config, train_rows: int, time_mapping: TimeMapping | None = None) -> Plan:
    """The Plan of a settled config over `train_rows` training rows on this run's processes."""
    world = process_state().num_processes
    return compile_plan(config, train_rows=train_rows, world_size=world, time_mapping=time_mapping)


def trainer_for(
    config: Config | Plan,
    model: nn.Module,
    objective: Objective,
    train_data: Dataset,
    val_data: Dataset | None = None,
    extensions: Sequence[Extension] = (),
    **parts: Any,
) -> EnhancedTrainer:
    """A Trainer of your own model, objective and datasets for `config` (or a compiled Plan;
    the Python API);
    `parts` go to stackwise.train.builders.build_trainer (adapter, strategy, ...)."""
    plan = config
    if not isinstance(config, Plan):
        rows = len(train_data) if hasattr(train_data, "__len__") else None
        plan = compile_plan(config, train_rows=rows, world_size=process_state().num_processes)
    return build_trainer(
        plan, model, objective, train_data, val_data, extensions=extensions, **parts
    )


def trainer_of(config: Config) -> EnhancedTrainer:
    """The end-to-end Trainer of a config (its whole model and data), e.g. for the LR finder."""
    adapter = get_model_adapter(adapter_for(config))
    plan, data = prepared(config)
    model = adapter.build(plan, plan.model.vocab_size or len(data.tokenizer))
    objective = objective_from(plan.objective, plan.masking, data.specials)
    return build_trainer(plan, model, objective, data.train, data.val, adapter=adapter)


def progressive_recipe(
    config: Config, data: PreparedData, time_mapping: TimeMapping | None = None, **kw: Any
) -> ProgressiveRecipe:
    """The progressive recipe of a config over prepared `data` (the Python API)."""
    from stackwise.progressive.recipe import ProgressiveRecipe

    config = resolve_vocab(config, len(data.tokenizer))
    return ProgressiveRecipe(plan_for(config, data.train_size, time_mapping), data, **kw)


def train_from_config(
    config: Config, quiet: bool = False, strategy: str | None = None, adapter: str = "rack"
) -> RunResult:
    """Prepare the data and train with `strategy` (default: the one the config asks for,
    see stackwise.strategies.strategy_for) on the model `adapter` builds."""
    config = derive(config, {}, "the config")  # every rule again: attribute edits check alone
    if OBJECTIVES.capabilities(config.objective.name).labels_from_batch:
        raise StackWiseError(
            f"objective '{config.objective.name}' reads labels from the batch, and the "
            "pretraining data has none. Use the Python API with a dataset that yields "
            "'labels' (or the seeds' 'targets'): stackwise.pipeline.trainer_for, or "
            "ProgressiveTrainer(config).train_progressively(dataloader=...) for a progressive "
            "run."
        )
    chosen = get_training_strategy(strategy or strategy_for(config), config.train)  # fail first
    check_options(chosen, config.train.strategy_options)  # read by a strategy of your own
    check_placement(config.parallel.strategy, chosen)
    model_adapter = get_model_adapter(adapter_for(config) if adapter == "rack" else adapter)
    plan, data = prepared(config)
    result = run_strategy(chosen, plan, data, model_adapter, quiet)
    release_run_folder(result.output_dir)  # finished: the next run may take the folder quietly
    return result
