"""`UnifiedTrainer(config).train_all_layers(dataloader, model_layers)` (seed 000): one trainer
for every way a config trains, over the layers it is given and the batches of a DataLoader.

- progressive.strategy progressive: the layers are grown as stacks, one training stage per
  group: `mode` layerwise (one layer per stack), blockwise (`block_size` layers per stack), fused
  (the stages, then `joint_tuning_steps` over the whole rack). Each stage is the real
  progressive recipe (stackwise.progressive): the trunk frozen, quantized or adapted by LoRA as
  the config says, the activation cache, time as depth, the stage's budget and objective.
- end_to_end: the layers, grouped in stacks of model.blocks_per_stack, train as one rack at once
  (rackwise: one loss; stackwise: a detached loss per stack); with lora.enabled the stacks'
  base weights are frozen (stored as quant.type with quant.enabled) under one adapter each.

The layers given (stackwise.Block objects, Stacks or a Rack) are the modules trained, in place:
their shape decides the rack's (d_model, heads, FFN width), their count the number of stacks.
Embeddings, final norm and head are made for the run (see unified_data for the vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackwise.config import Config, derive, from_dict
from stackwise.errors import StackWiseError
from stackwise.fronts.unified_data import LoaderData, loader_data, read_rows, vocabulary
from stackwise.fronts.unified_layers import (
    GivenLayers,
    LoggedLocalLosses,
    LoggedStep,
    StageLossLog,
    as_layers,
    grouped,
    layer_shape,
    rack_of,
)
from stackwise.model.layers import Block
from stackwise.objectives import objective_from
from stackwise.pipeline import plan_for
from stackwise.plan import spec_of
from stackwise.progressive.recipe import ProgressiveRecipe
from stackwise.registry import OBJECTIVES
from stackwise.spec import ModelSpec, Plan
from stackwise.strategies import strategy_for
from stackwise.strategies.report import save_all_stacks
from stackwise.train.adapters import get_model_adapter
from stackwise.train.builders import build_trainer

__all__ = ["StageLosses", "UnifiedResult", "UnifiedTrainer"]


@dataclass
class StageLosses:
    """One training stage: the layers it trained (their indices in the list given) and the
    loss of each of its optimizer steps."""

    stage: int | str  # the stack's index, or "joint" / "rack"
    layers: list[int]
    losses: list[float]

    @property
    def first(self) -> float:
        return self.losses[0]

    @property
    def last(self) -> float:
        return self.losses[-1]


@dataclass
class UnifiedResult:
    rack: Any  # the trained Rack, whose stacks hold the layers given
    plan: Plan
    output_dir: Path
    stages: list[StageLosses] = field(default_factory=list)
    progressive: Any = None  # the ProgressiveResult of a grown run (records, final eval)
    state: Any = None  # the TrainState of an end-to-end run
    runner: Any = None  # the ProgressiveRecipe, or the end-to-end EnhancedTrainer


class UnifiedTrainer:
    """Train given layers as the config says (see the module doc). `tokenizer`: the one the
    data's ids come from (saved with the run; else the ids are the vocabulary);
    `output_dir`: where the run is written (default: train.output_dir)."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        tokenizer: Any = None,
        output_dir: str | Path | None = None,
        quiet: bool = False,
    ) -> None:
        self.config = config if config is not None else Config()
        self.tokenizer, self.output_dir, self.quiet = tokenizer, output_dir, quiet
        self.result: UnifiedResult | None = None

    # -- the layers -------------------------------------------------------------------------

    def group_size(self, config: Config | None = None) -> int:
        """Layers per stack: 1 layerwise; block_size (else blocks_per_stack) otherwise."""
        c = config or self.config
        p = c.progressive
        if p.strategy == "progressive" and p.mode == "layerwise":
            return 1
        return p.block_size or c.model.blocks_per_stack

    def new_layers(self, n: int | None = None) -> list[Block]:
        """`n` fresh layers (default model.n_stacks x the group size) of the config's shape,
        attending as its objective does: what train_all_layers trains when given none."""
        c = self.config
        count = n or c.model.n_stacks * self.group_size()
        spec: ModelSpec = spec_of(c.model, ModelSpec)
        return [Block(spec, c.objective.causal) for _ in range(count)]

    # -- training ---------------------------------------------------------------------------

    def train_all_layers(self, dataloader: Any, model_layers: Any = None) -> UnifiedResult:
        """Train `model_layers` (default: new_layers()) on `dataloader`'s batches, read once
        (at most data.num_samples rows), the last data.val_fraction held out to evaluate."""
        config = from_dict(self.config.model_dump(mode="json"), "UnifiedTrainer's config")
        layers = as_layers(model_layers if model_layers is not None else self.new_layers())
        groups = grouped(layers, self.group_size(config))
        rows = read_rows(dataloader, config.data.num_samples)
        masked = bool(OBJECTIVES.capabilities(config.objective.name).masked)
        vocab, specials = vocabulary(rows, config.model.vocab_size, masked, self.tokenizer)
        config = self._settled(config, layers, len(groups), vocab, rows["input_ids"].shape[1])
        data = loader_data(rows, config.data.val_fraction, self.tokenizer, specials)
        plan = plan_for(config, data.train_size)
        if config.progressive.strategy == "progressive":
            result = self._grow(plan, data, groups)
        else:
            result = self._end_to_end(plan, data, groups)
        index = {id(b): i for i, b in enumerate(layers)}
        grown = iter(groups)
        for stage in result.stages:  # a grown stage trains its group; rack and joint: all
            group = next(grown) if isinstance(stage.stage, int) else layers
            stage.layers = [index[id(b)] for b in group]
        self.result = result
        return result

    def _settled(
        self, config: Config, layers: list[Block], n_stacks: int, vocab: int, length: int
    ) -> Config:
        """The config of this run: the stacks, shape, vocabulary and length the layers and
        the data decide (a conflicting setting is refused), and the output dir."""
        shape, causal = layer_shape(layers)
        if causal != config.objective.causal:
            raise StackWiseError(
                f"The layers given attend {'causally' if causal else 'both ways'}, but "
                f"objective '{config.objective.name}' trains "
                f"{'causal' if config.objective.causal else 'bidirectional'} attention; build "
                "them for it (UnifiedTrainer(config).new_layers()) or change objective.name."
            )
        p = config.progressive
        for bad, what in (
            (config.model.init_from_hf, "model.init_from_hf imports a trunk"),
            (p.growth.init != "random", f"progressive.growth.init '{p.growth.init}' starts stacks"),
            (p.growth.noise > 0, f"progressive.growth.noise {p.growth.noise} perturbs new stacks"),
        ):
            if bad:
                raise StackWiseError(
                    f"{what}, but train_all_layers trains the layers it is given, as given; "
                    "remove it, or train from the config alone with stackwise.train_from_config."
                )
        target = p.target_stacks
        if target is not None and target != n_stacks:
            raise StackWiseError(
                f"progressive.target_stacks is {target}, but the {len(layers)} layers given "
                f"make {n_stacks} stacks of {self.group_size(config)}; give "
                f"{target * self.group_size(config)} layers, or remove target_stacks."
            )
        m = config.model
        changes: dict[str, Any] = {"model.n_stacks": n_stacks, "model.vocab_size": vocab}
        changes["model.blocks_per_stack"] = min(self.group_size(config), len(layers))
        for key, value in shape.items():
            if m.changed(key) and getattr(m, key) != value:
                raise StackWiseError(
                    f"model.{key} is {getattr(m, key)}, but the layers given have {value}; "
                    f"remove model.{key} (the layers decide it) or give layers of that shape."
                )
            changes[f"model.{key}"] = value
        changes |= {"data.seq_len": length, "model.max_seq_len": max(m.max_seq_len, length)}
        if self.output_dir is not None:
            changes["train.output_dir"] = str(self.output_dir)
        return derive(config, changes, "the layers and data given to train_all_layers")

    def _grow(self, plan: Plan, data: LoaderData, groups: list[list[Block]]) -> UnifiedResult:
        log = LoggedStep()
        recipe = ProgressiveRecipe(plan, data, quiet=self.quiet, strategy=log)
        recipe.growing.builder.grow = GivenLayers(groups)
        grown = recipe.train_progressively()
        recipe.save(self.tokenizer)
        stages = _stages(log, plan)
        return UnifiedResult(grown.rack, plan, recipe.output_dir, stages, grown, runner=recipe)

    def _end_to_end(self, plan: Plan, data: LoaderData, groups: list[list[Block]]) -> UnifiedResult:
        assert plan.model.vocab_size is not None
        if plan.parallel.shards:  # its blocks are the caller's: no whole copy to gather into
            raise StackWiseError(
                "UnifiedTrainer trains the blocks you hand it, and under FSDP "
                "(parallel.strategy: fsdp) they would end as shards with no whole model to "
                "save. Train with parallel.strategy: ddp here, or shard a config run "
                "(`stackwise train CONFIG parallel.strategy=fsdp`, or Trainer(config))."
            )
        rack = rack_of(plan, plan.model.vocab_size, groups)
        log = LoggedLocalLosses() if strategy_for(plan) == "local_losses" else LoggedStep()
        objective = objective_from(plan.objective, plan.masking, data.specials)
        trainer = build_trainer(
            plan,
            rack,
            objective,
            data.train,
            data.val,
            adapter=get_model_adapter("rack"),
            strategy=log,
        )
        state = trainer.train()
        stacks = (lambda out: save_all_stacks(rack, out)) if plan.progressive.save_stacks else None
        trainer.save(self.tokenizer, weights=plan.progressive.save_rack, also=stacks)
        stages = [StageLosses("rack", [], log.runs[-1] if log.runs else [])]
        return UnifiedResult(rack, plan, trainer.output_dir, stages, state=state, runner=trainer)


def _stages(log: StageLossLog, plan: Plan) -> list[StageLosses]:
    """One entry per grown stack, then the joint tuning (mode fused)."""
    n = plan.model.n_stacks
    out = [StageLosses(i, [], losses) for i, losses in enumerate(log.runs[:n])]
    out += [StageLosses("joint", [], losses) for losses in log.runs[n:]]
    return out
