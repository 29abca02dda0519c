"""Seed 003's progressive entry points on a config, over our real progressive components.

- `ProgressiveRackBuilder(config=config, building_mode=..., default_precision=...)`: the builder
  with every setting from the config (shape, vocabulary, attention, time embedding, each
  stack's LoRA adapter under lora.strategy, the trunk adapter, max_stacks).
- `create_stack_from_config(stack_id=0, n_blocks=4, config=config)`: one stack, made as that
  builder would grow it.
- `ProgressiveTrainer(config)` then `train_progressively(rack_builder=, dataloader=,
  target_stacks=)` or `train_rack(...)`: the progressive recipe on the config's plan, training
  the builder's rack stage by stage on the dataloader's dataset (its batch size; the config's
  trunk strategy, cache and objective); it returns the per-stack records.
- `TimeStepMasking`, `ProgressiveDataLoader`, `compute_loss`: see progressive_time and
  stackwise.progressive.seed_loader.
Importing this module registers the config-reading halves with the classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset
from torch.utils.data.dataloader import default_collate

from stackwise.config import Config
from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.fronts.progressive_time import TimeStepMasking, checked, tokenizer_of
from stackwise.model.layers import Stack
from stackwise.pipeline import plan_for, resolve_vocab
from stackwise.plan import adapter_dtype, compile_plan, stage_adapter, trunk_adapter
from stackwise.progressive import seed_builder
from stackwise.progressive.builder import ProgressiveRackBuilder
from stackwise.progressive.recipe import ProgressiveRecipe, ProgressiveTrainer
from stackwise.progressive.seed_loader import ProgressiveDataLoader, compute_loss
from stackwise.registry import OBJECTIVES
from stackwise.spec import AdapterSpec

__all__ = [
    "ProgressiveDataLoader",
    "ProgressiveRackBuilder",
    "ProgressiveRecipe",
    "ProgressiveTrainer",
    "TimeStepMasking",
    "compute_loss",
    "create_stack_from_config",
]


def builder_settings(config: Any) -> dict[str, Any]:
    """What `ProgressiveRackBuilder(config=config)` reads from the config."""
    config = checked(config, "ProgressiveRackBuilder(config=...)")
    if config.model.vocab_size is None:  # the tokenizer the config's data section describes
        config = resolve_vocab(config, len(tokenizer_of(config)))
    plan = compile_plan(config)
    lo, p, m = config.lora, config.progressive, config.model
    capped = p.target_stacks is not None or m.changed("n_stacks")
    return {
        "spec": plan.model,
        "vocab_size": plan.model.vocab_size,
        "causal": plan.objective.causal,
        "num_time_steps": plan.masking.num_time_steps,
        "double_quant": plan.quant.enabled and plan.quant.double_quant,
        "growth_operator": p.growth.init,
        "growth_noise": p.growth.noise,
        "building_mode": p.building_mode,
        "default_precision": p.new_stack_precision,
        "max_stacks": m.n_stacks if capped else None,
        "stack_adapters": {
            i: a for i in range(m.n_stacks) if (a := stage_adapter(config, i)) is not None
        },
        "default_adapter": AdapterSpec(lo.rank, lo.alpha, lo.dropout, adapter_dtype(config)),
        "trunk_adapter": trunk_adapter(config),
    }


def create_stack_from_config(
    stack_id: int = 0,
    n_blocks: int | None = None,
    config: Config | None = None,
    precision: str | None = None,
) -> Stack:
    """Stack `stack_id` as a builder of `config` would grow it: its shape, initialisation,
    precision (default the config's new_stack_precision) and LoRA adapter (lora.strategy's
    rank for that stack), outside any rack."""
    if config is None:
        raise StackWiseError("create_stack_from_config needs config=... (a StackWise config).")
    return ProgressiveRackBuilder(config=config).create_stack(stack_id, n_blocks, precision)


class LoaderRows(Dataset):
    """The caller's dataset as a progressive run reads it: items as dicts of tensors, the
    seeds' `targets` as our `labels`, batched by the caller's collate function."""

    def __init__(self, data: Any, collate_fn: Callable | None = None) -> None:
        self.data = data
        self.collate = None if collate_fn in (None, default_collate) else collate_fn
        self.tokenizer = getattr(data, "tokenizer", None)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.data[i]
        item = dict(item) if isinstance(item, dict) else {"input_ids": item}
        if "targets" in item and "labels" not in item:
            item["labels"] = item.pop("targets")
        return item


def loader_rows(loader: Any, what: str) -> LoaderRows:
    data = getattr(loader, "dataset", None)
    if data is None or not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise StackWiseError(
            f"The {what} must be a torch DataLoader over a dataset with a length and indexed "
            "items ({'input_ids': ...} each): a progressive run trains each stack on it for "
            "its own budget of steps and keys its cached activations by item."
        )
    return LoaderRows(data, getattr(loader, "collate_fn", None))


def train_seed_run(
    recipe: ProgressiveRecipe,
    rack_builder: ProgressiveRackBuilder | None,
    dataloader: Any,
    target_stacks: int | None,
    tokenizer: Any = None,
    eval_dataloader: Any = None,
) -> None:
    """Set up `ProgressiveTrainer(config)` for a run on `dataloader` growing `rack_builder`."""
    seed = recipe.seed
    assert seed is not None
    if dataloader is None:
        raise StackWiseError(
            "ProgressiveTrainer(config).train_progressively needs dataloader=... (a torch "
            "DataLoader of {'input_ids': ...} items): the data each stack trains on."
        )
    train = loader_rows(dataloader, "dataloader")
    changes: dict[str, Any] = {"progressive.strategy": "progressive"}
    if dataloader.batch_size:
        changes["train.batch_size"] = dataloader.batch_size
    cfg = seed.config
    unset = cfg.progressive.target_stacks is None and not cfg.model.changed("n_stacks")
    if target_stacks is not None and unset:
        changes["progressive.target_stacks"] = target_stacks
    config = checked(cfg, "ProgressiveTrainer(config)", **changes)
    labels = OBJECTIVES.capabilities(config.objective.name).labels_from_batch
    if labels and "labels" not in train[0]:
        raise StackWiseError(
            f"objective '{config.objective.name}' (training_objective: custom) takes its targets "
            "from the batch, and this dataset's items have none: give each item 'targets' (or "
            "'labels'), -100 where no loss counts."
        )
    tok = tokenizer_of(config, tokenizer, train)
    val = loader_rows(eval_dataloader, "eval_dataloader") if eval_dataloader else None
    data = PreparedData(tokenizer=tok, train=train, val=val, n_documents=0, n_tokens=0)  # type: ignore[arg-type]
    config = resolve_vocab(config, len(tok))
    plan = plan_for(config, len(train), seed.time_mapping)
    if rack_builder is not None:  # before the run folder is claimed
        seed_builder.check_fit(rack_builder, plan)
    recipe.setup(plan, data, seed.output_dir, seed.quiet, seed.strategy, rack_builder)


if not seed_builder.BUILDER_FRONT:
    seed_builder.BUILDER_FRONT.append(builder_settings)
if not seed_builder.TRAINER_FRONT:
    seed_builder.TRAINER_FRONT.append(train_seed_run)
