"""How a run's processes place its model: the parallel section and the launch (an
`accelerate launch --use_fsdp`) resolved into the plan's ParallelSpec."""

from __future__ import annotations

from dataclasses import replace

from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.launcher import fsdp_launch
from stackwise.registry import OBJECTIVES, PARALLELIZERS
from stackwise.spec import ModelSpec, ParallelSpec, Plan


def model_spec(config: Config, spec: ModelSpec) -> ModelSpec:
    """The model section's `spec`; an FSDP launch's activation checkpointing turns on
    model.gradient_checkpointing (per block); block diffusion sets the rack's block layout."""
    if OBJECTIVES.capabilities(config.objective.name).blocks:
        ob = config.objective
        spec = replace(spec, diffusion_block=ob.block_size, diffusion_shift=ob.block_shift)
    launch = fsdp_launch()
    if launch is not None and launch["activation_checkpointing"]:
        spec = replace(spec, gradient_checkpointing=True)
    return spec


def parallel_spec(config: Config, given: str | None) -> ParallelSpec:
    """parallel.strategy (or `given`), auto resolved; an `accelerate launch --use_fsdp`
    makes it fsdp (a config that names another strategy is refused)."""
    p = config.parallel
    settings = {
        "sharding": p.sharding,
        "shard_group_size": p.shard_group_size,
        "param_dtype": p.param_dtype,
        "reduce_dtype": p.reduce_dtype,
        "cpu_offload": p.cpu_offload,
    }
    name = given or p.strategy
    launch = fsdp_launch()
    if launch is not None:
        if name not in ("auto", "fsdp"):
            raise StackWiseError(
                f"This run was launched for FSDP (accelerate launch --use_fsdp), but "
                f"parallel.strategy is '{name}'. Launch without --use_fsdp, or set "
                "parallel.strategy: fsdp (or leave it out); on a CPU, DDP needs `accelerate "
                "launch --multi_gpu`."
            )
        name = "fsdp"
        settings["sharding"] = settings["sharding"] or launch.get("sharding")
        settings["cpu_offload"] = settings["cpu_offload"] or launch["cpu_offload"]
    if name == "auto" and p.deepspeed_config is not None:
        name = "deepspeed"  # the seeds' --deepspeed_config alone asks for it
    chosen = name != "auto"
    name = name if chosen else default_parallelizer(config)
    shards = PARALLELIZERS.capabilities(name, "parallel.strategy").shards
    if name == "fsdp":
        settings["sharding"] = settings["sharding"] or "full_shard"
    zero = deepspeed_config(config) if name == "deepspeed" else None
    return ParallelSpec(name, chosen=chosen, shards=shards, deepspeed=zero, **settings)


def deepspeed_config(config: Config) -> dict:
    """What deepspeed.initialize gets: the parallel and train sections over the user's file
    (the config rules refused files that disagree with them)."""
    from stackwise.config import deepspeed_file as ds

    p = config.parallel
    given = ds.read_file(p.deepspeed_config) if p.deepspeed_config else {}
    return ds.build(given, config.train, p.sharding, p.cpu_offload)


def default_parallelizer(config: Config) -> str:
    """What the config's strategy declares it needs (local losses: an unwrapped model, for
    several backward passes a step), else DDP."""
    from stackwise.strategies import strategy_for
    from stackwise.train.strategy import STRATEGY_FAMILY

    return STRATEGY_FAMILY.capabilities(strategy_for(config)).parallelizer or "ddp"


def with_launch_recorded(plan: Plan) -> Plan:
    """What an FSDP launch decided, written into the plan's config (config.yaml): a later
    process (generate, eval, a resume under torchrun) has no launch to read it from. A
    sharded run records the sharding it uses (full_shard when unset)."""
    launch, p = fsdp_launch(), plan.parallel
    if launch is None:
        if p.name != "fsdp":
            return plan
        return replace(plan, source=plan.with_source("parallel", {"sharding": p.sharding}))
    values = {"strategy": "fsdp", "sharding": p.sharding, "cpu_offload": p.cpu_offload}
    plan = replace(plan, source=plan.with_source("parallel", values))
    if launch["activation_checkpointing"]:
        plan = replace(plan, source=plan.with_source("model", {"gradient_checkpointing": True}))
    return plan
