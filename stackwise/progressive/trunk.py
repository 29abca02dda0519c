"""A trunk's activations as data: the hidden states entering a rack's stack k, for keyed samples.

What the seeds call activation streaming. A sample's hidden state at a stack boundary is read
from an activation cache when it is there (the trunk does not run) and is otherwise streamed
through the trunk (embeddings, then the stacks before k) and, when caching, written to the cache
for next time. Samples are addressed by key (stackwise.progressive.stage.KeyedSamples): their
masks are drawn from the key too, so a cached entry always belongs to the same corrupted input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stackwise.errors import StackWiseError
from stackwise.model.rack import Rack
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.stage import cached_trunk


class TrunkActivations:
    def __init__(
        self,
        rack: Rack,
        cache: ActivationCache | None = None,
        *,
        dtype: str = "bf16",
        max_bytes: int | None = None,
        storage: str = "memory",
        folder: str | Path | None = None,
    ) -> None:
        """`cache`: an ActivationCache to read and fill (made on first use when None, sized
        for the keys and sequence length of the data that first asks, holding every stack
        boundary: cache mode 'rack')."""
        self.rack, self.cache = rack, cache
        self.settings = {"dtype": dtype, "max_bytes": max_bytes, "storage": storage}
        self.folder = folder

    def _cache_for(self, n_keys: int, seq_len: int) -> ActivationCache:
        if self.cache is None:
            self.cache = ActivationCache(
                n_keys,
                seq_len,
                self.rack.cfg.d_model,
                folder=self.folder,
                mode="rack",
                boundaries=len(self.rack.stacks) + 1,
                **self.settings,
            )
        if self.cache.shape[0] != seq_len:
            raise StackWiseError(
                f"This activation cache holds sequences of {self.cache.shape[0]} tokens; the "
                f"batch has {seq_len}. Use one cache per sequence length."
            )
        return self.cache

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        stack_idx: int,
        keys: torch.Tensor,
        t: torch.Tensor | None = None,
        n_keys: int | None = None,
        write: bool = True,
    ) -> torch.Tensor:
        """(B, L, d_model) hidden states entering the rack's stack `stack_idx` (rack order;
        `len(rack.stacks)`: the trunk's output) for `input_ids` (what the model sees) with
        sample keys `keys` and, for a time-conditioned rack, times `t`. `n_keys`: how many keys
        the data holds (the size of a cache made now)."""
        stacks = list(self.rack.stacks)
        if not 0 <= stack_idx <= len(stacks):
            raise StackWiseError(
                f"stack_idx={stack_idx}: the rack has {len(stacks)} stacks, so its boundaries "
                f"are 0..{len(stacks)}."
            )
        n = n_keys if n_keys is not None else int(keys.max()) + 1
        cache = self._cache_for(n, input_ids.shape[1])
        before = stacks[:stack_idx]
        modes = [s.training for s in before]
        for s in before:
            s.eval()  # a frozen trunk's output must not depend on dropout draws
        try:
            return cached_trunk(self.rack, before, cache, input_ids, t, keys, write)
        finally:
            for s, mode in zip(before, modes, strict=True):
                s.train(mode)

    @property
    def stats(self) -> dict[str, Any]:
        """Hits, misses and evictions so far, and the trunk forwards the misses ran."""
        if self.cache is None:
            return {"hits": 0, "misses": 0, "evictions": 0, "trunk_forwards": 0}
        return {**self.cache.stats.as_dict(), "trunk_forwards": self.cache.trunk_calls}
