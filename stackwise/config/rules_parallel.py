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
    if p.strategy == "deepspeed" or p.deepspeed_config is not None:
        return  # rules_deepspeed: ZeRO reads cpu_offload and sharding too
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
    if cfg.model.load_in_8bit:
        yield (
            "model.load_in_8bit does not run under FSDP: bitsandbytes' 8-bit weights keep "
            "their row statistics outside the parameter, where a shard cannot carry them; "
            f"load the base in 4 bits (model.load_in_4bit: QLoRA shards), or {instead}"
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
    four_bit = cfg.quant.enabled or cfg.progressive.trunk_strategy == "qlora"
    if cfg.parallel.cpu_offload and (four_bit or cfg.model.load_in_4bit):
        hf = cfg.model.load_in_4bit and cfg.model.quant_storage != "uint8"
        if not hf:
            yield (
                "parallel.cpu_offload cannot hold integer-coded weights (4-bit or fp8 codes): "
                "FSDP2's offload makes every shard a parameter that takes gradients, which an "
                "integer tensor cannot. Remove parallel.cpu_offload (the coded base is small)"
                + (
                    ", or store it as floats: model.quant_storage: bf16"
                    if cfg.model.load_in_4bit
                    else ""
                )
            )


@cross_rule
def fsdp_4bit_storage(cfg: Config) -> Iterator[str]:
    """FSDP2 casts floating parameters to its gather dtype: 4-bit codes packed into a float
    storage (model.quant_storage) would be cast as numbers and corrupted. uint8 it leaves be."""
    m, p = cfg.model, cfg.parallel
    if not shards(cfg) or not m.load_in_4bit or m.quant_storage == "uint8":
        return
    gather = p.param_dtype if p.param_dtype != "auto" else cfg.train.mixed_precision
    if gather != "no" and gather != m.quant_storage:
        yield (
            f"model.quant_storage is {m.quant_storage} and FSDP gathers the weights in "
            f"{gather} (parallel.param_dtype, auto: train.mixed_precision): it would cast the "
            "packed 4-bit codes as numbers and corrupt them. Set model.quant_storage: uint8 "
            f"(FSDP2 gathers it untouched), or model.quant_storage: {gather}"
        )
