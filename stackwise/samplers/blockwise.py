"""The block sampler: a block-diffusion rack (objective block_diffusion) writes its blocks left
to right (`block`: ancestral steps inside a block; `block_remask`: ranked by
sample.remasking). Each block starts masked and is revealed step by step; every step scores only
that block, attending to the finished blocks through a KV cache that grows by one clean block
when the block is done, so a step costs one block's compute, not the whole sequence's."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stackwise.model.layers import KVCache
from stackwise.objectives.schedules import time_for_fraction
from stackwise.registry import register_sampler
from stackwise.samplers.draws import Progress, split_steps
from stackwise.samplers.methods import Ancestral


@register_sampler("block", blocks=True)
class BlockSampler(Ancestral):
    """Blocks of the rack's own size; inside a block, the MDLM reverse process. A rack grown
    with time as depth runs its stacks up to a noise level's own: each such set of stacks keeps
    its own cache (and its own prediction of a block's first token), filled when first used."""

    start: int
    end: int

    def fill(self, x: torch.Tensor, p: int, length: int, on_block: Progress | None) -> torch.Tensor:
        run, rack = self.run, self.run.rack
        size = getattr(rack, "block_size", None)
        if size is None:
            raise ValueError(
                "sampler block decodes a rack trained with objective block_diffusion; this rack "
                "was not. Use sampler ancestral, remask, confidence or remdm"
            )
        if p == 0 and rack.block_shift:
            raise ValueError(
                "block diffusion predicts each token from the one before it: give a prompt of "
                "at least one token"
            )
        self.reset()
        first = p // size
        for b in range(first):  # the prompt's whole blocks go straight into the cache
            self.finish(x[:, b * size : (b + 1) * size])
        starts = list(range(first * size, p + length, size))
        for start, steps in zip(starts, split_steps(run.s.steps, len(starts)), strict=True):
            self.start, self.end = start, min(start + size, p + length)
            in_block = torch.zeros_like(x, dtype=torch.bool)
            in_block[:, max(start, p) : self.end] = True
            x = self.fill_block(x, in_block, steps)
            if on_block is not None:
                on_block(x[:, : self.end])
            ended = run.eos_id is not None and bool((x[:, p:] == run.eos_id).any(1).all())
            if ended or self.end == p + length:
                break
            self.finish(x[:, start : self.end])
        return x

    def reset(self) -> None:
        """No finished block yet: caches (and carried predictions) per depth, built lazily."""
        self.caches: dict[int | None, KVCache] = {}
        self.carries: dict[int | None, Tensor | None] = {}
        self.blocks: list[Tensor] = []

    def finish(self, ids: Tensor) -> None:
        """A finished block joins every cache (kept for the depths not yet used too)."""
        self.blocks.append(ids)
        for depth in self.caches:
            self.append(depth, ids)

    def append(self, depth: int | None, ids: Tensor) -> None:
        rack = self.run.rack
        h = rack.run_stacks(rack.embed_tokens(ids), None, self.stacks(depth), self.caches[depth])
        self.carries[depth] = rack.head(h[:, -1]).float()
        self.run.stats.forward_passes += 1
        self.run.stats.row_passes += ids.shape[0]

    def cache(self, depth: int | None) -> KVCache:
        if depth not in self.caches:
            self.caches[depth], self.carries[depth] = KVCache(), None
            for ids in self.blocks:
                self.append(depth, ids)
        return self.caches[depth]

    def stacks(self, depth: int | None) -> list[torch.nn.Module]:
        """The stacks an input at `depth` runs (all of them without depth routing)."""
        rack = self.run.rack
        if depth is None:
            return list(rack.stacks)
        return [s for s, r in zip(rack.stacks, rack.depth_ranges, strict=True) if r[0] <= depth]

    def window(self, x: torch.Tensor) -> tuple[int, int]:
        return self.start, self.end

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, V): the current block's predictions (shifted: position j's from j - 1, the
        block's first from the finished blocks)."""
        run, rack = self.run, self.run.rack
        ids = x[:, self.start : self.end]
        t = None
        if rack.uses_time:
            t = time_for_fraction(run.schedule, (ids == run.mask_id).float().mean(1))
        h = rack.embed_tokens(ids)
        if rack.time_embed is not None:
            assert t is not None
            h = h + rack.time_embed(t).to(h.dtype)[:, None, :]
        out = torch.zeros((*ids.shape, rack.vocab_size), device=x.device)
        groups: list[tuple[int | None, Tensor | None]] = [(None, None)]
        if rack.depth_ranges is not None:
            assert t is not None
            depth = rack.depth_of(t)
            groups = [(g, depth == g) for g in depth.unique().tolist()]
        for g, rows in groups:
            pick = slice(None) if rows is None else rows
            view = self.cache(g).reader(rows)
            scored = rack.head(rack.run_stacks(h[pick], None, self.stacks(g), view)).float()
            if not rack.block_shift:  # each position predicts its own token
                out[pick] = scored
                continue
            carry = self.carries[g]
            first = carry[pick] if carry is not None else scored.new_zeros(scored[:, 0].shape)
            out[pick] = torch.cat([first[:, None], scored[:, :-1]], 1)
        out[..., run.banned] = -math.inf
        run.stats.forward_passes += 1
        run.stats.row_passes += x.shape[0]
        return out

    def mend(self, x: torch.Tensor, in_block: torch.Tensor) -> tuple[Tensor, Tensor]:
        """The repeat guard inside the current block only: the finished ones are cached."""
        fixed, grown = super().mend(x, in_block)
        if fixed is x:
            return x, in_block
        fixed[:, : self.start] = x[:, : self.start]
        grown[:, : self.start] = False
        return fixed, grown


@register_sampler("block_remask", blocks=True, uses_remasking=True)
class BlockRemask(BlockSampler):
    """The block sampler with LLaDA's rule inside each block: each step reveals its share of
    the block's masked positions, those sample.remasking ranks first."""

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        return self.run.remask(masked, logits, tokens, steps - j)
