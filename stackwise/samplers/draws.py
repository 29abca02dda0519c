"""The draws every masked sampler makes: filtered tokens in float64, ranking rules for what
to reveal first, the split of steps over blocks, and the cut after EOS."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

REMASKING = ("low_confidence", "random", "entropy", "margin")
Progress = Callable[[torch.Tensor], None]  # sees (B, n) tokens generated so far, for streaming


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top_k logits, then the smallest set whose probability reaches top_p."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(-1, idx, sorted_logits)
    return logits


def draw(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    """Tokens from softmax(logits / temperature), filtered, drawn in float64; argmax at T=0."""
    logits = filter_logits(logits.double(), top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1)
    probs = (logits / temperature).softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(probs.shape[:-1])


def rank_scores(rule: str, logits: Tensor, tokens: Tensor, gen: torch.Generator) -> Tensor:
    """Higher = reveal first."""
    if rule == "random":
        return torch.rand(tokens.shape, generator=gen, device=tokens.device, dtype=torch.float64)
    probs = logits.double().softmax(-1)
    if rule == "low_confidence":
        return probs.gather(-1, tokens[..., None]).squeeze(-1)
    if rule == "entropy":
        return (probs * probs.clamp_min(1e-30).log()).sum(-1)  # minus the entropy
    if rule == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    raise ValueError(f"unknown remasking rule {rule!r}; use one of {REMASKING}")


def split_steps(steps: int, blocks: int) -> list[int]:
    """Each block's share of the steps (at least one each)."""
    base, extra = divmod(max(steps, blocks), blocks)
    return [base + (1 if i < extra else 0) for i in range(blocks)]


def truncate_at_eos(x: torch.Tensor, start: int, eos_id: int | None, fill: int) -> torch.Tensor:
    """Everything after the first EOS of the generated part becomes `fill` (dropped on decode)."""
    if eos_id is None:
        return x
    gen_part = x[:, start:]
    seen = (gen_part == eos_id).int().cumsum(1)
    after = (seen - (gen_part == eos_id).int()) > 0
    out = x.clone()
    out[:, start:] = gen_part.masked_fill(after, fill)
    return out
