"""The parallel section: how a multi-process run places its model (DDP replicas, FSDP2
shards, DeepSpeed ZeRO partitions) and, for sharded runs, the shards' layout, precision and
offload."""

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
        "each), fsdp (FSDP2: parameters, gradients and optimizer state sharded), deepspeed "
        "(DeepSpeed ZeRO-2/3, an optional extra: pip install stackwise[deepspeed]), manual "
        "(unwrapped, gradients averaged by hand), or a registered parallelizer of your own; "
        "auto: ddp, or manual for local losses.",
    )
    sharding: Sharding | None = Field(
        None,
        description="fsdp: full_shard (parameters resharded after forward), shard_grad_op "
        "(kept whole from forward to backward), hybrid_shard (sharded within a node, "
        "replicated across nodes), no_shard (replicated: DDP through FSDP). None: full_shard. "
        "The seeds' FULL_SHARD spelling is read too. deepspeed: full_shard is ZeRO-3, "
        "shard_grad_op ZeRO-2, no_shard ZeRO-0 (None: the config file's stage, else 3).",
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
        "on the CPU (FSDP2's CPUOffloadPolicy); deepspeed: ZeRO's optimizer offload (and "
        "parameter offload at stage 3). Saves accelerator memory for speed.",
    )
    deepspeed_config: str | None = Field(
        None,
        description="deepspeed: a DeepSpeed JSON config (the seeds' --deepspeed_config) for "
        "what StackWise does not set itself (zero_optimization, offload, communication); "
        "batch sizes, accumulation, clipping and precision must be absent, 'auto' or equal to "
        "train.*. Setting it makes parallel.strategy auto mean deepspeed.",
    )
