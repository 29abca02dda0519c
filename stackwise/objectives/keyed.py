"""Counter-based randomness: uniforms that are a pure function of (key, stream, position).

Cached activations are only reusable if the corrupted input they came from can be rebuilt
exactly, so masks for cached samples are drawn from their key rather than from a generator's
running state. The hash works on int64 tensors on any device.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash; multipliers < 2**31 keep every product inside int64."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def keyed_uniform(keys: torch.Tensor, n: int, stream: int, seed: int = 0) -> torch.Tensor:
    """(B,) int64 keys -> (B, n) uniforms in [0, 1), the same for the same key every time."""
    keys = keys.long()
    h = mix32(mix32(keys) ^ mix32((keys >> 32) + 0x1234567 * (stream + 1) + seed))
    pos = torch.arange(n, device=keys.device, dtype=torch.long)
    u = mix32(h[:, None] ^ mix32(pos * 2 + 1 + (seed & 0xFFFF) * 65_537)[None, :])
    return (u >> 8).float() / float(1 << 24)  # 24 bits: exact in float32, never 1.0
