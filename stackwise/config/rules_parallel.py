"""Rules on sharded training (parallel.strategy: fsdp): the settings only FSDP reads, and
what does not run sharded yet, refused rather than run unsharded or ignored."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.launcher import fsdp_launch

FSDP_ONLY = ("shard_group_size", "param_dtype", "reduce_dtype", "cpu_offload")


def shards(cfg: Config) -> bool:
    """The run shards: parallel.strategy fsdp, or an `accelerate launch --use_fsdp`."""
    return cfg.parallel.strategy == "fsdp" or fsdp_launch() is not None


@cross_rule
def fsdp_settings(cfg: Config) -> Iterator[str]:
    """The keys only FSDP reads, refused under another placement (parallel.sharding is
    noted instead: the seeds write it beside distributed_strategy: ddp)."""
    p = cfg.parallel
    if not shards(cfg):
        for name in FSDP_ONLY:
            if p.changed(name):
                yield (
                    f"parallel.{name} applies to sharded training only; set "
                    "parallel.strategy: fsdp, or remove it"
                )
        return
    if p.shard_group_size is not None and p.sharding != "hybrid_shard":
        yield (
            "parallel.shard_group_size sets hybrid_shard's groups; set parallel.sharding: "
            "hybrid_shard, or remove it"
        )


@cross_rule
def fsdp_not_yet(cfg: Config) -> Iterator[str]:
    """What FSDP does not shard yet: refused, each with what to run instead."""
    if not shards(cfg):
        return
    instead = "train it with parallel.strategy: ddp (a whole copy on each process)"
    if cfg.progressive.strategy == "progressive":
        yield (
            "progressive growth does not run under FSDP yet (each stage would have to shard "
            f"the rack it grows); {instead}, or train the rack end to end "
            "(progressive.strategy: end_to_end) under FSDP"
        )
    if cfg.quant.enabled or cfg.model.load_in_4bit or cfg.model.load_in_8bit:
        yield (
            "quantized weights (quant.enabled, model.load_in_4bit/8bit: QLoRA) do not run "
            f"under FSDP yet: the 4-bit statistics are not sharded; {instead}, or fine-tune "
            "the unquantized model (LoRA) under FSDP"
        )
    if cfg.train.consolidated_weights:
        yield (
            "train.consolidated_weights writes each checkpoint's whole model, and a sharded "
            "run's checkpoints hold shards (gathering them at every save would undo the "
            "sharding); the finished run's model.safetensors is whole. Remove "
            "train.consolidated_weights"
        )
    if cfg.memory_on:
        yield f"the memory extension does not run under FSDP yet; {instead}"
