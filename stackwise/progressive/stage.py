"""One progressive stage: the rack seen as (trunk before) -> new stack -> (trunk after) -> head.

`StageModel` is what the foundation Trainer trains while one stack grows. With a frozen trunk in
append mode it reads the trunk's output from the activation cache instead of running the trunk;
`KeyedSamples` gives every training item the stable key that the cache and the keyed masks use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from stackwise import seeds
from stackwise.model.layers import Stack
from stackwise.model.rack import Rack
from stackwise.progressive.cache import ActivationCache


class KeyedSamples(Dataset):
    """`variants` masked versions of each sample; item j is sample j // variants.

    `cache_key` (j) addresses the cache; `mask_key` also folds in the seed so that masks, time
    steps and hence cached states differ between seeds. With `times`, variant v trains at
    t = times[v] exactly (store_all_time_steps).
    """

    def __init__(
        self,
        base: Dataset,
        variants: int,
        seed: int,
        times: list[float] | None = None,
    ) -> None:
        if times is not None and len(times) != variants:
            raise ValueError("one time per variant")
        self.base, self.variants, self.seed, self.times = base, variants, seed, times
        self.fixed_shard = True  # per-rank caches: each rank keeps its own keys

    def __len__(self) -> int:
        return len(self.base) * self.variants  # type: ignore[arg-type]

    def __getitem__(self, j: int) -> dict[str, Any]:
        item = dict(self.base[j // self.variants])
        item["cache_key"] = j
        item["mask_key"] = seeds.mask_key(self.seed, j)
        if self.times is not None:
            item["t"] = torch.tensor(self.times[j % self.variants])
        return item


def _requires_grad(modules: list[nn.Module]) -> bool:
    return any(p.requires_grad for m in modules for p in m.parameters())


class StageModel(nn.Module):
    """The rack with one new stack, reading a frozen trunk from the cache when it can."""

    def __init__(
        self,
        rack: Rack,
        new_stack: Stack,
        cache: ActivationCache | None = None,
        precision: str = "no",
    ) -> None:
        super().__init__()
        self.rack = rack
        self.new_stack = new_stack
        self.cache = cache
        self.precision = precision
        pos = next(i for i, s in enumerate(rack.stacks) if s is new_stack)
        self.before = list(rack.stacks)[:pos]  # plain lists: the rack already registers them
        self.after = list(rack.stacks)[pos + 1 :]
        self.train()  # from the first step, not only after an evaluation switched modes

    @property
    def uses_time(self) -> bool:
        return self.rack.uses_time

    def checkpoint_module(self) -> nn.Module:
        """What a stage checkpoint saves and restores: the whole rack (new stack included)."""
        return self.rack

    def rank_local_modules(self) -> list[nn.Module]:
        """What one process may run without its peers: the trunk behind the activation cache
        (each process's own keys miss at their own times) and a denoising chain's stacks
        (routed by each batch's noise levels). A sharder must not make their forward
        collective; FSDP gathers them with the root unit instead, at every forward."""
        if self.rack.chain is not None:
            return list(self.rack.stacks)
        return list(self.before) if self.cache is not None else []

    @property
    def boundary(self) -> int:
        """The cache boundary this stage reads: the number of stacks before the new one."""
        return len(self.before)

    def param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """The rack's groups, with the stacks grown before this stage's as `trunk`."""
        groups = self.rack.param_groups()
        new = {id(p) for p in self.new_stack.parameters()}
        blocks = groups.pop("blocks")
        groups["blocks"] = [(n, p) for n, p in blocks if id(p) in new]
        groups["trunk"] = [(n, p) for n, p in blocks if id(p) not in new]
        return {k: [(n, p) for n, p in v if p.requires_grad] for k, v in groups.items()}

    def train(self, mode: bool = True) -> StageModel:
        """Frozen stacks before the new one stay in eval mode: their output (and so the cache)
        must not depend on dropout draws."""
        super().train(mode)
        for stack in self.before:
            if not _requires_grad([stack]):
                stack.eval()
        return self

    # -- trunk --------------------------------------------------------------------------------

    def _upstream_frozen(self) -> bool:
        upstream: list[nn.Module] = [self.rack.embed_tokens, *self.before]
        if self.rack.time_embed is not None:
            upstream.append(self.rack.time_embed)
        return not _requires_grad(upstream)

    def _trunk_from_embeddings(
        self, ids: torch.Tensor, mask: torch.Tensor | None, t: torch.Tensor | None
    ) -> torch.Tensor:
        h = self.rack.embed(ids, t)
        return self.rack.run_stacks(h, mask, self.before) if self.before else h

    def _cached_trunk(
        self, ids: torch.Tensor, t: torch.Tensor | None, keys: torch.Tensor
    ) -> torch.Tensor:
        assert self.cache is not None
        return cached_trunk(self.rack, self.before, self.cache, ids, t, keys)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        cache_key: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.rack.chain is not None:  # a denoising chain: the rack runs it (model.chain)
            return self.rack(input_ids, attention_mask, t)
        use_cache = (
            self.cache is not None
            and cache_key is not None
            and self.before
            and (attention_mask is None or bool(attention_mask.bool().all()))
        )
        if use_cache:
            assert cache_key is not None
            h = self._cached_trunk(input_ids, t, cache_key)
        elif self._upstream_frozen():
            with torch.no_grad():  # nothing before the new stack trains: keep no activations
                h = self._trunk_from_embeddings(input_ids, attention_mask, t)
        else:
            h = self._trunk_from_embeddings(input_ids, attention_mask, t)
        h = self.rack.run_stacks(h, attention_mask, [self.new_stack, *self.after])
        return self.rack.logits(h)


def cached_trunk(
    rack: Rack,
    before: list[Stack],
    cache: ActivationCache,
    ids: torch.Tensor,
    t: torch.Tensor | None,
    keys: torch.Tensor,
    write: bool = True,
) -> torch.Tensor:
    """The output of the stacks `before` (the trunk) for these keys: hits are read, misses
    computed and (with `write`) stored.

    Misses are also rounded to the cache dtype, so a step trains on the same numbers whether
    its rows were hits or misses (which keeps resumes and storages identical).
    """
    b = len(before)
    key_list = [int(k) for k in keys.tolist()]
    hits, misses = cache.lookup(b, key_list)
    out = torch.empty((ids.shape[0], *cache.shape), dtype=cache.dtype, device=ids.device)
    if hits:
        read = cache.read(b, [key_list[i] for i in hits])
        out[torch.tensor(hits, device=ids.device)] = read.to(ids.device)
    groups: dict[int | None, list[int]] = {}
    for i in misses:  # start each miss from the deepest boundary that has it (mode rack)
        groups.setdefault(cache.deepest(key_list[i], b), []).append(i)
    for start, rows_list in groups.items():
        rows = torch.tensor(rows_list, device=ids.device)
        part = [key_list[i] for i in rows_list]
        with torch.no_grad():
            if start is None:
                h = rack.embed(ids[rows], t[rows] if t is not None else None)
                h = rack.run_stacks(h, None, before) if before else h
                cache.trunk_calls += 1
            else:
                h = cache.read(start, part).to(ids.device).float()
                h = rack.run_stacks(h, None, before[start:])
        if write:
            cache.write(b, part, h)
        out[rows] = h.to(cache.dtype)
    return out.float()


@torch.no_grad()
def advance_cache(
    cache: ActivationCache,
    boundary: int,
    stack: Stack,
    rack: Rack,
    device: torch.device,
    autocast: Any,
    chunk: int = 64,
) -> int:
    """Push every entry at `boundary` through the now frozen `stack` into `boundary + 1`.

    This is what makes growth cheap: the next stage's trunk output costs one stack's forward
    per cached sample, not the whole trunk's. Returns the number of entries carried over.
    """
    keys = cache.entries(boundary)
    was_training = stack.training
    stack.eval()
    starts = range(0, len(keys), chunk)
    for i in tqdm(starts, desc="carrying the cache", unit="chunk", leave=False, disable=None):
        part = keys[i : i + chunk]
        h = cache.read(boundary, part).to(device).float()
        with autocast():
            h = rack.run_stacks(h, None, [stack])
        cache.write(boundary + 1, part, h)
    stack.train(was_training)
    if cache.mode == "stack":
        cache.drop_except(boundary + 1)
    return len(keys)
