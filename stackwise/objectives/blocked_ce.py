"""Cross entropy of large logits on a CPU, a block of rows at a time.

`F.cross_entropy` over (N, V) logits writes several full-size fp32 tensors: the upcast copy of
bf16 logits, the log-softmax it keeps for backward, and in backward the gradient of that and of
the logits. At a large vocabulary each is hundreds of MB, and on a CPU each is a fresh mapping
(above glibc's 32 MiB mmap ceiling) whose pages fault in. Here the forward keeps the logits as
they are and each row's log-sum-exp; the backward rebuilds the softmax a block of rows at a time,
in cache. The values are F.cross_entropy's within fp32 rounding (tests/test_blocked_ce.py); at
logits of 64 MB (fp32) and more it is faster on one and on two CPU threads and peaks at a
fraction of the memory (benchmarks/RESULTS.md, section blocked_ce).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

IGNORE = -100
BLOCK_FP32_BYTES = 2 * 2**20  # a block's fp32 rows: 16 of a 32k vocabulary (1-2 MiB measured best)
MIN_FP32_BYTES = 64 * 2**20  # below this the library's fused kernels are as fast or faster


def pays(logits: Tensor, weights: Tensor | None = None) -> bool:
    """Whether these logits take the blocked path: large, on a CPU, outside torch.compile,
    with weights that need no gradient (a learned weighting keeps the library's path)."""
    return (
        logits.device.type == "cpu"
        and logits.numel() * 4 >= MIN_FP32_BYTES
        and not torch.compiler.is_compiling()
        and not (weights is not None and weights.requires_grad)
    )


def _blocks(flat: Tensor) -> list[slice]:
    """The row blocks of (N, V) logits: as many rows as fit BLOCK_FP32_BYTES in fp32, one
    at least (at a vocabulary of 131k, 4 rows: larger blocks spill out of cache and ran
    slower than the library, benchmarks/RESULTS.md)."""
    step = max(1, BLOCK_FP32_BYTES // (flat.shape[1] * 4))
    return [slice(s, s + step) for s in range(0, flat.shape[0], step)]


class _BlockedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, flat: Tensor, targets: Tensor, weights: Tensor) -> Tensor:
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        total = torch.zeros((), dtype=torch.float32, device=flat.device)
        for rows in _blocks(flat):
            z, t = flat[rows].float(), targets[rows]
            lse[rows] = torch.logsumexp(z, -1)
            picked = z.gather(1, t.clamp_min(0)[:, None]).squeeze(1)
            # an IGNORE row adds exactly 0, whatever its column 0 holds (-inf too)
            ce = torch.where(t == IGNORE, 0.0, lse[rows] - picked)
            total += (ce * weights[rows]).sum()
        ctx.save_for_backward(flat, targets, weights, lse)
        return total

    @staticmethod
    @once_differentiable  # no double backward (nothing here needs one)
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        flat, targets, weights, lse = ctx.saved_tensors
        out = torch.empty_like(flat)
        for rows in _blocks(flat):
            # out of place: for fp32 logits .float() is the logits themselves
            p = torch.sub(flat[rows].float(), lse[rows, None]).exp_()  # the softmax
            picked = targets[rows].clamp_min(0)  # IGNORE rows weigh 0: any column will do
            p[torch.arange(picked.shape[0], device=p.device), picked] -= 1.0
            out[rows] = p.mul_((weights[rows] * grad)[:, None])
        return out, None, None


def blocked_ce_sum(logits: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
    """sum(weights * cross entropy) over the positions of (..., V) logits, in fp32; positions
    whose target is IGNORE count 0, and `weights` None weighs every other position 1. The
    weights get no gradient (`pays` sends weights that need one to the library's path)."""
    flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    if bool(((t < 0) & (t != IGNORE)).any()):  # the library refuses them too
        raise ValueError(f"a target below 0 that is not IGNORE ({IGNORE}): {int(t.min())}")
    scored = (t != IGNORE).float()
    if weights is not None:
        scored = torch.broadcast_to(weights, targets.shape).reshape(-1).float() * scored
    return _BlockedCE.apply(flat, t, scored)


@torch.no_grad()
def blocked_token_ce(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-position cross entropy in fp32, 0 at IGNORE, without a full-size fp32 copy."""
    flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    out = torch.empty(t.shape[0], dtype=torch.float32, device=flat.device)
    for rows in _blocks(flat):
        out[rows] = F.cross_entropy(
            flat[rows].float(), t[rows], ignore_index=IGNORE, reduction="none"
        )
    return out.view(targets.shape)
