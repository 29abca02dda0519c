"""RMSNorm and SwiGLU's silu(gate) * up with the same outputs as the plain ops, keeping fewer
tensors for backward.

Eager autograd keeps what each elementary op needs. On a CPU, `F.rms_norm` is a chain of them
(PyTorch has no fused CPU kernel for it), so it keeps its input *and* the normalized copy; a
SwiGLU keeps gate, up *and* silu(gate). Together that is about a quarter more activation memory
than a GPT of the same size keeps (benchmarks/peak_memory.py). These functions keep the input
and 1/rms of a norm, and gate and up of a SwiGLU, and recompute the rest in backward:
elementwise work, cheap next to the matrix products.

Where they would not help they step aside: off the CPU (recent PyTorch fuses `F.rms_norm` on
CUDA), under `torch.compile` (inductor chooses what to keep itself), and for a norm in bf16 or
fp16 (the plain op computes in fp32 inside; this backward would not). They support first-order
backward and torch.func's transforms (grad, vmap, jacrev); double backward raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class _RMSNorm(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add(eps))  # as the CPU composite
        return x.mul(rstd).mul(weight), rstd  # out of place: vmap may batch weight alone

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        x, weight, _ = inputs
        rstd = output[1]
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(x, weight, rstd)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor, _: Any) -> tuple[Tensor | None, Tensor | None, None]:
        # with n = x * rstd and p = grad * n: dweight = sum over rows of p, and
        # dx = rstd * (grad * weight - n * mean(p * weight)); p @ weight is that mean's sum as
        # one matrix-vector product: four elementwise passes and two reductions in all
        x, weight, rstd = ctx.saved_tensors
        width = x.shape[-1]
        scaled = grad * rstd
        product = (scaled * x).reshape(-1, width)
        grad_weight = product.sum(0) if ctx.needs_input_grad[1] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            along = (product @ weight).view(rstd.shape).mul_(rstd.square()).div_(width)
            # out of place: under vmap weight may be batched where grad is not, and in-place
            # addcmul_ has no batching rule
            grad_x = torch.addcmul(scaled * weight, x, along, value=-1)
        return grad_x, grad_weight, None


class _SiluMul(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(gate: Tensor, up: Tensor) -> Tensor:
        return F.silu(gate) * up

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)  # silu recomputed
        return grad_gate, grad_up


def _recording(*tensors: Tensor) -> bool:
    """Whether autograd will record this call (the functions only change what it keeps)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`F.rms_norm` over the last dimension, keeping x and 1/rms for backward on a CPU."""
    if (
        x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.float64)
        and _recording(x, weight)
        and not torch.compiler.is_compiling()
    ):
        return _RMSNorm.apply(x, weight, eps)[0]
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, keeping gate and up for backward (silu(gate) is recomputed)."""
    same = gate.shape == up.shape and gate.dtype == up.dtype  # no broadcasting: one layout
    if same and _recording(gate, up) and not torch.compiler.is_compiling():
        return _SiluMul.apply(gate, up)
    return F.silu(gate) * up


def kept_for_backward(model: torch.nn.Module, step: Callable[[], Tensor]) -> int:
    """Bytes of the activations autograd keeps for backward while `step()` computes a loss,
    which is then backpropagated (parameters and buffers aside; views of one storage count
    once): the memory these functions save, measured."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    kept: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step().backward()
    return sum(kept.values())
