"""Attention masks and the block-diffusion layout.

A block-diffusion rack (objective block_diffusion) reads its input as two copies of one
sequence side by side, [noised; clean], both at positions 0..L-1. A noised position sees its
own block of the noised copy and the clean blocks before it; a clean position sees the clean
blocks up to its own. One pass thus trains every block's denoiser, each conditioned on the
clean text before it, as BD3-LM does. With the shift (objective.block_shift), token j is
predicted at position j - 1 as the causal LM does: from the noised copy inside a block, from
the clean copy for a block's first token, so with blocks of one token the rack is exactly the
causal LM. Without it (BD3-LM's own choice), each masked position of the noised copy predicts
its own token, seeing every revealed token of its block.
"""

from __future__ import annotations

from functools import lru_cache

import torch


def sdpa_mask(
    attention_mask: torch.Tensor | None, causal: bool, length: int
) -> torch.Tensor | None:
    """Padding mask (B, L) of 1/0 -> boolean SDPA mask (B, 1, L, L); None when nothing is padded.

    Every query may always see itself, so fully padded rows never produce NaN.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    mask = keep[:, None, None, :].expand(-1, 1, length, -1)
    eye = torch.eye(length, dtype=torch.bool, device=keep.device)
    if causal:
        mask = mask & torch.tril(torch.ones_like(eye))
    return mask | eye


@lru_cache(maxsize=8)  # a few lengths (training, eval rows) per run
def block_layout(length: int, block_size: int, device: torch.device) -> torch.Tensor:
    """(2L, 2L) bool: which positions of [noised; clean] (L each) a query may attend."""
    block = torch.arange(length, device=device) // block_size
    blocks = torch.cat([block, block])
    clean = torch.arange(2 * length, device=device) >= length
    qb, kb = blocks[:, None], blocks[None, :]
    qc, kc = clean[:, None], clean[None, :]
    from_noised = (~kc & (kb == qb)) | (kc & (kb < qb))
    from_clean = kc & (kb <= qb)
    return torch.where(qc, from_clean, from_noised)


def block_mask(
    attention_mask: torch.Tensor | None, length: int, block_size: int, device: torch.device
) -> torch.Tensor:
    """SDPA mask (B or 1, 1, 2L, 2L) of the doubled layout; `attention_mask` (B, 2L) drops
    padded keys (each query still sees itself)."""
    layout = block_layout(length, block_size, device)[None, None]
    if attention_mask is None or bool(attention_mask.bool().all()):
        return layout
    keep = attention_mask.bool()[:, None, None, :]
    eye = torch.eye(2 * length, dtype=torch.bool, device=device)
    return (layout & keep) | eye


def from_clean_copy(length: int, block_size: int, device: torch.device) -> torch.Tensor:
    """(L,) bool: predictions taken from the clean copy (a block's last position, which
    predicts the next block's first token)."""
    return (torch.arange(length, device=device) + 1) % block_size == 0


def block_outputs(h: torch.Tensor, block_size: int, shift: bool = True) -> torch.Tensor:
    """(B, L, d) from the doubled (B, 2L, d): position j's output predicts token j + 1 with
    `shift`, token j without (BD3-LM's own-position prediction: the noised copy alone)."""
    length = h.shape[1] // 2
    if not shift:
        return h[:, :length]
    clean = from_clean_copy(length, block_size, h.device)[None, :, None]
    return torch.where(clean, h[:, length:], h[:, :length])
