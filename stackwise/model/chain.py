"""Time as depth grown high-noise-to-low, read as one denoising chain through the rack.

Stack g (growth order = rack order, append mode) denoises from noise level s_g, the top of its
range, down to s_{g+1}. Stack 0 sees the embeddings of the input at s_0 = 1 (all masked); every
later stack continues the previous stack's hidden state (rescaled to the embeddings' size, see
Rack.chain_input) plus the embeddings of the sequence at its own level, where more tokens are
revealed. So one forward pass
through the rack, with tokens drawn from the head between stacks, samples from full noise
(`sample.sampler: single_pass`).

Training and scoring see the same computation: an input at noise t, in stack g's range, is
masked further to each higher level s_0 > ... > s_{g-1} by the forward process itself (a
revealed token is masked at level s with probability (m(s) - m(t)) / (1 - m(t)), m being the
schedule's mask fraction; one uniform per position keeps the levels nested), and the chain up to
stack g runs on those inputs. The uniforms are a hash of the input and t, so scores are
deterministic and a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stackwise.objectives.keyed import keyed_uniform, mix32

# what a stack's input is in the chain; recorded with every chain stack so a run grown with an
# earlier formula (1: previous output plus embedding deltas, which drowned the tokens) is refused
CHAIN_INPUT_VERSION = 2


@dataclass(frozen=True)
class DenoisingChain:
    mask_id: int
    mask_fraction: Callable[[torch.Tensor], torch.Tensor]  # the schedule's m(t), t in [0, 1]


def content_uniforms(ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """(B, L) uniforms that depend only on each row's tokens and its t."""
    pos = torch.arange(ids.shape[1], device=ids.device, dtype=torch.long)
    per_token = mix32(ids.long() * 0x10001 + mix32(pos)[None, :] + 0x2545F491)
    t_bits = (t.double() * (1 << 30)).long()
    keys = per_token.sum(1) * 0x3F1 + mix32(t_bits)
    return keyed_uniform(keys, ids.shape[1], stream=5)


def nested_inputs(
    chain: DenoisingChain,
    x: torch.Tensor,
    t: torch.Tensor,
    levels: list[float],
    real: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """x (at noise t) masked further to each of `levels` (decreasing, all >= t), then x itself."""
    m_t = chain.mask_fraction(t.float()).double()[:, None]
    u = content_uniforms(x, t).double()
    revealed = x != chain.mask_id
    if real is not None:
        revealed &= real.bool()
    out = []
    for level in levels:
        m_s = chain.mask_fraction(torch.full_like(t, level, dtype=torch.float32)).double()
        p = ((m_s[:, None] - m_t) / (1.0 - m_t).clamp_min(1e-12)).clamp(0.0, 1.0)
        out.append(torch.where(revealed & (u < p), chain.mask_id, x))
    out.append(x)
    return out
