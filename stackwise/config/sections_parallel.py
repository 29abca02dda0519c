"""The parallel section: how a multi-process run places its model (DDP replicas, FSDP2
shards) and, for sharded runs, the shards' layout, precision and offload."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from stackwise.config.base import Section
from stackwise.config.names import ParallelizerName

Sharding = Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
ShardDtype = Literal["auto", "fp32", "bf16", "fp16"]


class ParallelConfig(Section):
    strategy: ParallelizerName = Field(
        "auto",
        description="How the model is placed on the run's processes: ddp (a whole copy on "
        "each), fsdp (FSDP2: parameters, gradients and optimizer state sharded), manual "
        "(unwrapped, gradients averaged by hand), or a registered parallelizer of your own; "
        "auto: ddp, or manual for local losses.",
    )
    sharding: Sharding | None = Field(
        None,
        description="fsdp: full_shard (parameters resharded after forward), shard_grad_op "
        "(kept whole from forward to backward), hybrid_shard (sharded within a node, "
        "replicated across nodes), no_shard (replicated: DDP through FSDP). None: full_shard. "
        "The seeds' FULL_SHARD spelling is read too.",
    )
    shard_group_size: PositiveInt | None = Field(
        None,
        description="hybrid_shard: processes per shard group (None: the processes of one node, "
        "LOCAL_WORLD_SIZE).",
    )
    param_dtype: ShardDtype = Field(
        "auto",
        description="fsdp: the dtype parameters are gathered in for forward and backward "
        "(the sharded master copy stays fp32); auto follows train.mixed_precision.",
    )
    reduce_dtype: ShardDtype = Field(
        "fp32", description="fsdp: the dtype gradients are reduced in (auto: param_dtype)."
    )
    cpu_offload: bool = Field(
        False,
        description="fsdp: keep the parameter shards, their gradients and the optimizer step "
        "on the CPU (FSDP2's CPUOffloadPolicy); saves accelerator memory for speed.",
    )
