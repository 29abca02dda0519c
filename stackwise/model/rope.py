"""Rotary position embeddings: the tables, built once per rack, and the rotation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

Rope = tuple[Tensor, Tensor]  # (cos, signed sin) tables for the positions being run


class Rotary(nn.Module):
    """RoPE tables for every position up to max_len, computed once (Llama's rotate-half layout).

    The sine table carries the rotation's sign (-sin on the first half, +sin on the second), so
    rotating is x * cos + roll(x, half) * sin: three elementwise ops and a roll instead of a
    chunk, a negation and a cat, with bit-identical results.
    """

    def __init__(self, head_dim: int, max_len: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat([freqs, freqs], dim=-1).cos(), persistent=False)
        sin = freqs.sin()
        self.register_buffer("sin", torch.cat([-sin, sin], dim=-1), persistent=False)

    def forward(self, length: int) -> Rope:
        return self.cos[:length], self.sin[:length]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, L, hd); `sin` signed as Rotary makes it."""
    return x * cos.to(x.dtype) + x.roll(x.shape[-1] // 2, dims=-1) * sin.to(x.dtype)
