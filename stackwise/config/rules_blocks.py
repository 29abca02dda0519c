"""Block diffusion's rules: its block size, its sampler, and what its layout cannot join."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.registry import OBJECTIVES, SAMPLERS


def _blocks(objective: str) -> bool:
    return bool(OBJECTIVES.capabilities(objective).blocks)


@cross_rule
def block_size(cfg: Config) -> Iterator[str]:
    """objective.block_size and block_shift are read by block diffusion only; a block must fit
    the sequence."""
    ob = cfg.objective
    if not _blocks(ob.name):
        for key in ("block_size", "block_shift"):
            if ob.changed(key):
                yield (
                    f"objective.{key} only applies to objective block_diffusion, not "
                    f"'{ob.name}'; remove it or set objective.name: block_diffusion"
                )
        return
    if ob.block_size is None:
        yield (
            "objective block_diffusion needs objective.block_size (tokens per block, e.g. 4; "
            "1 is the causal LM, data.seq_len one masked-diffusion block)"
        )
    elif ob.block_size > cfg.data.seq_len:
        yield (
            f"objective.block_size ({ob.block_size}) exceeds data.seq_len "
            f"({cfg.data.seq_len}); a block is at most the whole sequence"
        )
    moe = cfg.model.moe
    if moe.num_experts and moe.capacity_factor is not None:
        yield (
            "model.moe.capacity_factor drops tokens in sequence order, and a block-diffusion "
            "row holds its noised copy before its clean one, so a later block's revealed tokens "
            "could decide which clean tokens an earlier block reads; remove capacity_factor "
            "(every token routed) for objective block_diffusion"
        )
    if ob.attention != "auto":
        yield (
            "objective block_diffusion sets its own attention (block-causal over a clean and a "
            f"noised copy); remove objective.attention: {ob.attention}"
        )


@cross_rule
def block_sampling(cfg: Config) -> Iterator[str]:
    """A block-diffusion rack samples block by block, and only a block sampler does that."""
    blocks = _blocks(cfg.objective.name)
    sm = cfg.sample
    sampler = sm.resolved_sampler(cfg.objective.name)
    decodes_blocks = bool(SAMPLERS.capabilities(sampler).blocks)
    own = " or ".join(n for n in SAMPLERS.names() if SAMPLERS.capabilities(n).blocks)
    if blocks and not decodes_blocks:
        yield (
            f"sample.sampler: {sampler} scores the whole sequence at once, but a block_diffusion "
            f"rack reads a clean and a noised copy block by block; use sampler {own} (or auto: "
            "block)"
        )
    if decodes_blocks and not blocks:
        yield (
            f"sample.sampler: {sampler} decodes a rack trained with objective block_diffusion; "
            f"this run trains '{cfg.objective.name}'. Choose another sampler or objective"
        )
    if blocks and sm.changed("block_length"):
        yield (
            "sample.block_length does not apply to block diffusion: its blocks are "
            "objective.block_size long; remove it, or set sample.block_length=0 (its default) "
            "when overriding a preset"
        )


@cross_rule
def block_growth(cfg: Config) -> Iterator[str]:
    """Growth with block diffusion: every stack trains the same layout; no denoising chain."""
    p = cfg.progressive
    name = cfg.objective.name
    chained = p.time_interpretation == "depth" and p.depth_order == "high_to_low"
    if _blocks(name) and p.strategy == "progressive" and chained:
        yield (
            "progressive.depth_order: high_to_low grows a denoising chain over the whole "
            "sequence, which block diffusion's block-by-block layout does not have; use "
            "depth_order: low_to_high (or time_interpretation: input)"
        )
    for i, stack in sorted(p.stacks.items()):
        own = getattr(stack, "objective", None)
        if own is None:
            continue
        layout = ("name", "block_size", "block_shift")
        if (_blocks(own.name) or _blocks(name)) and any(
            getattr(own, k) != getattr(cfg.objective, k) for k in layout
        ):
            yield (
                f"progressive.stacks[{i}].objective differs from objective ({name}) in its "
                "name, block_size or block_shift; every stack of a block-diffusion rack "
                "shares one layout, so set them only in objective"
            )
