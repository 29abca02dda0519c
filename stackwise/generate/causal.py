"""Causal sampling: token by token with a KV cache over the last max_seq_len tokens."""

from __future__ import annotations

import torch

from stackwise.model.layers import KVCache
from stackwise.model.rack import Rack
from stackwise.samplers import Progress, SampleStats, draw, truncate_at_eos
from stackwise.spec import SampleSpec


@torch.no_grad()
def generate_clm(
    rack: Rack,
    ids: torch.Tensor,
    max_new: int,
    s: SampleSpec,
    gen: torch.Generator,
    eos_id: int | None = None,
    stats: SampleStats | None = None,
    use_cache: bool = True,
    on_token: Progress | None = None,
) -> torch.Tensor:
    """Token by token with a KV cache (each token costs one position's compute); the context is
    the last max_seq_len tokens. Stops once every row has produced EOS."""
    stats = stats if stats is not None else SampleStats()
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    start, window = ids.shape[1], rack.cfg.max_seq_len
    cache: KVCache | None = None
    for _ in range(max_new):
        if not use_cache:
            logits = rack(ids[:, -window:])[:, -1].float()
        elif cache is not None and cache.length < window:  # room for the newest token
            logits = rack(ids[:, -1:], cache=cache)[:, -1].float()
        else:  # the first pass, or the window moved on: fill the cache afresh
            cache = KVCache()
            logits = rack(ids[:, -window:], cache=cache)[:, -1].float()
        stats.forward_passes += 1
        nxt = draw(logits, s.temperature, s.top_k, s.top_p, gen)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if on_token is not None:
            on_token(ids)
        stats.tokens += int((~done).sum())
        if eos_id is not None:
            done |= nxt == eos_id
            if bool(done.all()):
                break
    return truncate_at_eos(ids, start, eos_id, eos_id if eos_id is not None else 0)
