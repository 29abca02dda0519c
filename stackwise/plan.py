"""Config at the door: one pure function turns a validated config into the run's frozen Plan.

Everything a config implies is decided here, once: the sections become specs (stackwise.spec),
`auto` choices are resolved (attention, sampler, best-metric direction), and each progressive
stage gets its spec with its budget, noise range, LR, seed, objective and adapter. Below the
pipeline nothing reads the config again and nothing is validated twice.
"""

from __future__ import annotations

import itertools
import math
import types
import typing
from dataclasses import fields, is_dataclass, replace
from typing import Any

from pydantic import BaseModel

from stackwise import seeds
from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.plan_parallel import model_spec, parallel_spec, with_launch_recorded
from stackwise.progressive.budget import default_shares, share_split
from stackwise.progressive.timing import TimeMapping, depth_range
from stackwise.quant.lora import rank_for
from stackwise.registry import OBJECTIVES
from stackwise.spec import (
    AdapterSpec,
    DataSpec,
    LoggingSpec,
    LoraSpec,
    MaskingSpec,
    MemorySpec,
    ModelSpec,
    ObjectiveSpec,
    Plan,
    ProgressiveSpec,
    QuantSpec,
    SampleSpec,
    StageSpec,
    TrainSpec,
)


def spec_of(value: Any, kind: Any) -> Any:
    """`value` (a config section, or plain data inside one) as the spec type `kind`: sections
    become spec dataclasses field by field, lists become tuples."""
    if isinstance(value, BaseModel) and is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        names = {f.name for f in fields(kind) if f.init}
        given = {n: spec_of(getattr(value, n), hints[n]) for n in names if hasattr(value, n)}
        return kind(**given)
    if isinstance(value, BaseModel):  # inside a union: the one dataclass member
        return spec_of(value, _dataclass_in(kind))
    if isinstance(value, list | tuple):
        args = typing.get_args(kind)
        inner = _dataclass_in(args[0]) if args else None
        return tuple(spec_of(v, inner) if inner else v for v in value)
    if isinstance(value, dict):
        args = typing.get_args(_strip_none(kind))
        inner = _dataclass_in(args[1]) if len(args) == 2 else None
        return {k: spec_of(v, inner) if inner else v for k, v in value.items()}
    return value


def _strip_none(kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    is_union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    return args[0] if is_union and len(args) == 1 else kind


def _dataclass_in(kind: Any) -> Any:
    if is_dataclass(kind):
        return kind
    for arg in typing.get_args(kind):
        if is_dataclass(arg):
            return arg
    return None


def objective_spec(section: BaseModel) -> ObjectiveSpec:
    """The objective with attention resolved (auto: the objective's own default)."""
    spec: ObjectiveSpec = spec_of(section, ObjectiveSpec)
    attention = spec.attention
    causal = (
        OBJECTIVES.capabilities(spec.name).causal if attention == "auto" else attention == "causal"
    )
    return replace(spec, causal=causal)


def sample_spec(config: Config) -> SampleSpec:
    s = config.sample
    base: SampleSpec = spec_of(s, SampleSpec)
    # what differs from its default (a saved run's config.yaml lists every field)
    changed = frozenset(n for n in type(s).model_fields if s.changed(n))
    sampler = base.sampler
    if sampler == "auto":
        sampler = OBJECTIVES.capabilities(config.objective.name).default_sampler
    return replace(base, sampler=sampler, changed_fields=changed)


def train_spec(config: Config, train_rows: int | None, world_size: int) -> TrainSpec:
    """train with max_steps resolved from num_train_epochs (when the data size is known)."""
    tc = config.train
    spec: TrainSpec = spec_of(tc, TrainSpec)
    spec = replace(spec, greater_is_better=tc.best_is_greater())
    if tc.num_train_epochs is not None and train_rows is not None:
        per_step = tc.batch_size * tc.grad_accum_steps * world_size
        steps = max(1, math.ceil(tc.num_train_epochs * train_rows / per_step))
        spec = replace(spec, max_steps=steps, num_train_epochs=None)
    return spec


def compile_plan(
    config: Config,
    *,
    train_rows: int | None = None,
    world_size: int = 1,
    time_mapping: TimeMapping | None = None,
    parallel: str | None = None,
) -> Plan:
    """The run's Plan. `train_rows` (the training set's size) resolves epochs into steps and
    each stage's budget; without it the plan has no stages (a saved run being loaded)."""
    train = train_spec(config, train_rows, world_size)
    plan = Plan(
        model=model_spec(config, spec_of(config.model, ModelSpec)),
        data=spec_of(config.data, DataSpec),
        objective=objective_spec(config.objective),
        masking=spec_of(config.masking, MaskingSpec),
        train=train,
        logging=spec_of(config.logging, LoggingSpec),
        sample=sample_spec(config),
        lora=spec_of(config.lora, LoraSpec),
        quant=spec_of(config.quant, QuantSpec),
        progressive=spec_of(config.progressive, ProgressiveSpec),
        memory=spec_of(config.memory, MemorySpec),
        memory_on=config.memory_on,
        parallel=parallel_spec(config, parallel),
        trunk_adapter=trunk_adapter(config),
        source=config.model_dump(mode="json"),
    )
    plan = with_launch_recorded(plan)
    if config.train.num_train_epochs is not None and train_rows is not None:
        # config.yaml records the budget the epochs came to, as a resume compares it
        plan = plan.with_section("train", max_steps=train.max_steps, num_train_epochs=None)
    if train_rows is None:
        return plan
    budgets = stage_budgets(config, train.max_steps, train_rows, world_size)
    stages = tuple(stage_spec(config, i, steps, time_mapping) for i, steps in enumerate(budgets))
    if time_mapping is not None:  # a config's own mappings were checked by its rules
        check_mapping(stages, config.progressive.depth_order == "high_to_low")
    return replace(plan, stages=stages)


def check_mapping(stages: tuple[StageSpec, ...], chained: bool) -> None:
    """A time mapping given in code must reach full noise (sampling starts at t=1), and a
    denoising chain needs the stacks' noise levels to fall in growth order."""
    ranges = [s.t_range for s in stages]
    if not ranges or any(r is None for r in ranges):
        return
    tops = [r[1] for r in ranges if r is not None]
    n = len(stages)
    if max(tops) < 1.0 - 1e-9:
        raise StackWiseError(
            f"The time mapping gives the {n} stacks noise levels up to t={max(tops):g} only, "
            "but sampling starts from full noise (t=1). Make the last stack's range reach 1."
        )
    if chained and any(b >= a for a, b in itertools.pairwise(tops)):
        raise StackWiseError(
            "progressive.depth_order: high_to_low grows a denoising chain from stack 0 at the "
            f"highest noise down; the time mapping gives range tops {tops}, which do not "
            "decrease. Give stack 0 the noisiest range."
        )


def adapter_dtype(config: Config) -> str:
    q = config.quant
    return "fp32" if not q.enabled or q.adapters_full_precision else "bf16"


def trunk_adapter(config: Config) -> AdapterSpec | None:
    lo = config.lora
    if not lo.trunk_adapters:
        return None
    return AdapterSpec(lo.trunk_rank, lo.trunk_alpha, lo.dropout, adapter_dtype(config))


def stage_adapter(config: Config, index: int) -> AdapterSpec | None:
    """Stack `index`'s own LoRA, added as the stack is created when LoRA is on (on a packed
    stack it is what trains; on a float one it trains beside the weights)."""
    lo = config.lora
    if not lo.enabled:
        return None
    rank, alpha = rank_for(index, config.model.n_stacks, lo)
    return AdapterSpec(rank, alpha, lo.dropout, adapter_dtype(config))


def stage_budgets(config: Config, max_steps: int, train_rows: int, world_size: int) -> list[int]:
    """Each stage's steps (growth.schedule): budget_share splits train.max_steps (resolved from
    num_train_epochs when given) by growth.shares; fixed and plateau plan each stage on its own
    (a plateau run's stages may then pass steps on, see progressive.budget)."""
    n, growth = config.model.n_stacks, config.progressive.growth
    if growth.schedule != "budget_share":
        return [stage_budget(config, i, max_steps, train_rows, world_size) for i in range(n)]
    weights = list(growth.shares) if growth.shares else default_shares(n)
    budgets = share_split(max_steps, weights)
    if min(budgets) < 1:
        raise StackWiseError(
            f"progressive.growth.schedule 'budget_share' splits train.max_steps={max_steps} "
            f"over {n} stacks by the shares {weights}, which leaves stack "
            f"{budgets.index(0)} no step. Raise train.max_steps, or give that stack a larger "
            "share."
        )
    return budgets


def stage_budget(
    config: Config, index: int, max_steps: int, train_rows: int, world_size: int
) -> int:
    """A stage's own steps: its override, steps_per_stack or epochs_per_stack, else an even
    part of train.max_steps (as resolved from num_train_epochs)."""
    p, tc = config.progressive, config.train
    over = p.stacks.get(index)
    if over and over.steps:
        return over.steps
    per_step = tc.batch_size * tc.grad_accum_steps * world_size
    epochs = over.epochs if over and over.epochs else p.epochs_per_stack
    if (over and over.epochs) or (p.epochs_per_stack and not p.steps_per_stack):
        assert epochs is not None
        return max(1, math.ceil(epochs * train_rows / per_step))
    if p.steps_per_stack:
        return p.steps_per_stack
    return max(1, max_steps // config.model.n_stacks)


def stage_t_range(
    config: Config, index: int, time_mapping: TimeMapping | None
) -> tuple[float, float] | None:
    """Stack `index`'s noise range when time is depth, over the full depth (model.n_stacks)."""
    p = config.progressive
    uses_time = OBJECTIVES.capabilities(config.objective.name).uses_time
    if p.time_interpretation != "depth" or not uses_time:
        return None
    n, steps = config.model.n_stacks, config.masking.num_time_steps
    if p.depth_mapping == "custom" and p.depth_time_table is None and time_mapping is None:
        raise StackWiseError(
            "progressive.depth_mapping is 'custom' with no depth_time_table, so the stacks' "
            "time steps come from a function given in Python, and none was given. Pass it "
            "(ProgressiveTrainer(config, time_mapping=fn), TimeStepMasking(config, "
            "time_mapping=fn), or progressive_recipe(config, data, time_mapping=fn)), or write "
            "the ranges as progressive.depth_time_table."
        )
    return depth_range(index, n, p, steps, time_mapping)  # reads the section as its spec


def stage_spec(config: Config, index: int, steps: int, mapping: TimeMapping | None) -> StageSpec:
    over = config.progressive.stacks.get(index)
    objective, masking = config.objective, config.masking
    if over is not None and over.objective is not None:
        objective = over.objective
    if over is not None and over.masking:
        # validated like the config (the load-time rule checked it): "false" is False here too
        masking = type(masking).model_validate({**masking.model_dump(), **over.masking})
    return StageSpec(
        index=index,
        steps=steps,
        lr=over.lr if over is not None and over.lr is not None else config.train.lr,
        seed=seeds.stage(config.train.seed, index),
        objective=objective_spec(objective),
        masking=spec_of(masking, MaskingSpec),
        t_range=stage_t_range(config, index, mapping),
        adapter=stage_adapter(config, index),
    )
