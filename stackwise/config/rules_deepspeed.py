"""Rules on DeepSpeed ZeRO runs (parallel.strategy: deepspeed, or a parallel.deepspeed_config):
the extra is installed, the config file agrees with train.*, and what ZeRO does not run here is
refused rather than run another way or ignored."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.errors import StackWiseError, deepspeed_missing

FSDP_KEYS = ("shard_group_size", "param_dtype", "reduce_dtype")


def runs_deepspeed(cfg: Config) -> bool:
    p = cfg.parallel
    return p.strategy == "deepspeed" or (p.strategy == "auto" and p.deepspeed_config is not None)


@cross_rule
def deepspeed_settings(cfg: Config) -> Iterator[str]:
    """The extra, the file, and the parallel keys ZeRO reads."""
    p = cfg.parallel
    if p.deepspeed_config is not None and not runs_deepspeed(cfg):
        yield (
            f"parallel.deepspeed_config configures DeepSpeed, and parallel.strategy is "
            f"'{p.strategy}'; set parallel.strategy: deepspeed (or leave it out), or remove "
            "parallel.deepspeed_config"
        )
    if not runs_deepspeed(cfg):
        return
    if find_spec("deepspeed") is None:
        yield deepspeed_missing("parallel.strategy: deepspeed").rstrip(".")
        return
    for name in FSDP_KEYS:
        if p.changed(name):
            yield (
                f"parallel.{name} is FSDP's and DeepSpeed does not read it (precision follows "
                "train.mixed_precision); remove it"
            )
    if p.sharding == "hybrid_shard":
        yield (
            "parallel.sharding: hybrid_shard is FSDP's; under DeepSpeed use full_shard "
            "(ZeRO-3), shard_grad_op (ZeRO-2) or no_shard, or parallel.strategy: fsdp"
        )
    if p.deepspeed_config is not None:
        from stackwise.config.deepspeed_file import conflicts, read_file

        try:
            yield from conflicts(read_file(p.deepspeed_config), cfg.train, p.sharding)
        except StackWiseError as err:
            yield str(err).rstrip(".")


@cross_rule
def deepspeed_not_here(cfg: Config) -> Iterator[str]:
    """What StackWise does not run under ZeRO, each with what to run instead."""
    if not runs_deepspeed(cfg):
        return
    instead = "shard with parallel.strategy: fsdp, which runs it"
    if cfg.progressive.strategy == "progressive":
        yield f"progressive growth does not run under DeepSpeed; {instead}"
    if cfg.quant.enabled or cfg.model.load_in_8bit:
        yield (
            "a quantized rack (quant.enabled) or an 8-bit model (model.load_in_8bit) does not "
            f"run under DeepSpeed here (a 4-bit Hugging Face model does); {instead}"
        )
    if cfg.parallel.cpu_offload and cfg.parallel.sharding == "no_shard":
        yield (
            "parallel.cpu_offload offloads ZeRO's partitions, and parallel.sharding: no_shard "
            "(ZeRO-0) partitions nothing; use shard_grad_op (ZeRO-2) or full_shard (ZeRO-3), "
            "or remove parallel.cpu_offload"
        )
    if cfg.memory_on:
        yield f"the memory extension does not run under DeepSpeed; {instead}"
    if cfg.train.mixed_precision == "fp16":
        yield "train.mixed_precision: fp16 does not run under DeepSpeed here; use bf16"
    if cfg.train.skip_nonfinite_steps:
        yield (
            "train.skip_nonfinite_steps cannot skip a DeepSpeed step (the engine steps on its "
            "own); remove it (a NaN/inf loss stops the run with a clear error)"
        )
    if cfg.train.consolidated_weights:
        yield (
            "train.consolidated_weights writes each checkpoint's whole model, and a DeepSpeed "
            "run's checkpoints hold ZeRO partitions; the finished run's model.safetensors is "
            "whole. Remove train.consolidated_weights"
        )
