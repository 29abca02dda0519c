"""Diffusion time conditioning: t in [0, 1] becomes a vector added to every position."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoid(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
    angles = (t.float() * scale)[:, None] * freqs[None, :]
    emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return emb if dim % 2 == 0 else torch.nn.functional.pad(emb, (0, 1))


class SinusoidalTime(nn.Module):
    """Fixed sinusoidal features of t (`dim` of them, model.time_embedding_dim; default
    d_model) through a trainable two-layer MLP into d_model."""

    def __init__(self, d_model: int, dim: int | None = None) -> None:
        super().__init__()
        self.d_model = d_model
        self.dim = dim or d_model
        self.mlp = nn.Sequential(
            nn.Linear(self.dim, d_model), nn.SiLU(), nn.Linear(d_model, d_model)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoid(t, self.dim).to(self.mlp[0].weight.dtype))


class LearnedTime(nn.Module):
    """One trainable vector per discrete time step: step k covers t in ((k)/T, (k+1)/T]. Its
    width is `dim` (model.time_embedding_dim); another width than d_model is projected."""

    def __init__(self, d_model: int, num_steps: int, dim: int | None = None) -> None:
        super().__init__()
        self.num_steps = num_steps
        self.table = nn.Embedding(num_steps, dim or d_model)
        self.proj = nn.Linear(dim, d_model, bias=False) if dim and dim != d_model else None

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        idx = (torch.ceil(t.float() * self.num_steps) - 1).clamp(0, self.num_steps - 1).long()
        h = self.table(idx)
        return self.proj(h) if self.proj is not None else h
