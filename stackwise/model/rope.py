"""Rotary position embeddings: the tables, built once per rack, and the rotation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def pair_halves(rows: Tensor, heads: int) -> Tensor:
    """A q or k projection's weight (or bias) with each head's output rows reordered from
    rotate-half (i, i + hd/2) to adjacent pairs (2i, 2i + 1). Queries and keys reordered alike
    give the same attention scores up to rounding: a dot product's terms, in another order."""
    half = rows.shape[0] // heads // 2
    return rows.view(heads, 2, half, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def rope_phases(rope: Rope, dtype: torch.dtype) -> Tensor:
    """The rotation as unit complex numbers, (L, 1, hd/2): cos + i sin per position and pair."""
    cos, sin = rope
    half = cos.shape[-1] // 2
    return torch.complex(cos[:, :half].to(dtype), sin[:, half:].to(dtype)).unsqueeze(1)


def rotated_heads(x: Tensor, layer: nn.Linear, heads: int, phases: Tensor) -> Tensor:
    """RoPE applied to `layer(x)` as one complex multiply, (B, heads, L, hd) in the paired order.

    Eager PyTorch rotates half-split heads in four elementwise passes forward and as many
    backward. With each head's pairs adjacent the rotation is one complex product each way;
    the reordering (`pair_halves`) is done on the weight, a copy of d_model x (heads x hd)
    values each call that autograd keeps until backward, instead of on the activations.
    fp32 and fp64 only: there is no bf16 complex type."""
    bias = None if layer.bias is None else pair_halves(layer.bias, heads)
    y = F.linear(x, pair_halves(layer.weight, heads), bias)
    b, n, _ = y.shape
    turned = torch.view_as_complex(y.view(b, n, heads, -1, 2)) * phases
    return torch.view_as_real(turned).view(b, n, heads, -1).transpose(1, 2)
