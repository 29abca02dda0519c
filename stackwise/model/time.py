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
    """Fixed sinusoidal features of t through a trainable two-layer MLP."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoid(t, self.d_model).to(self.mlp[0].weight.dtype))


class LearnedTime(nn.Module):
    """One trainable vector per discrete time step: step k covers t in ((k)/T, (k+1)/T]."""

    def __init__(self, d_model: int, num_steps: int) -> None:
        super().__init__()
        self.num_steps = num_steps
        self.table = nn.Embedding(num_steps, d_model)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        idx = (torch.ceil(t.float() * self.num_steps) - 1).clamp(0, self.num_steps - 1).long()
        return self.table(idx)
