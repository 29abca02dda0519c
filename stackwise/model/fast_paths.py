"""The faster ways a layer's computation may run, and when each may: q/k/v or gate/up as one
matmul, RoPE as a complex product, SDPA's core in fp32 for short bf16 sequences on a CPU. Each
gives the plain layers' results (tests/test_fast_paths.py); the layers in `layers` ask here."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as nn_module


def plain_linears(*modules: nn.Module) -> bool:
    """Whether these are ordinary nn.Linear layers whose weights can be read directly: not
    LoRA-wrapped or quantized, with no forward replaced, and no hooks of their own or global
    ones (ZeRO-3 gathers a weight in a hook; a backward hook must see the layer's call)."""
    if any(hooks for hooks in _global_hooks()):
        return False
    return all(
        type(m) is nn.Linear and "forward" not in vars(m) and not _hooked(m) for m in modules
    )


def _hooked(module: nn.Module) -> bool:
    own = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
    return any(getattr(module, name, None) for name in own)


def _global_hooks() -> list[dict]:
    """The hooks registered for every module (`register_module_forward_hook` and the like)."""
    names = ("forward_pre", "forward", "backward_pre", "backward")
    return [getattr(nn_module, f"_global_{name}_hooks", {}) for name in names]


def fusable(x: Tensor, *modules: nn.Module) -> bool:
    """Whether `joint_linear` may replace these layers' calls on `x`: plain linears that train
    alike (a frozen up_proj would otherwise get a gradient computed and thrown away), under an
    autocast to another dtype. There autocast saves a cast copy of the weights for backward
    anyway, so the stacked copy costs no memory; in full precision it would keep a second copy
    of the weights until backward (and, under FSDP2, of the gathered ones), for a ~1% gain."""
    kind = x.device.type
    if not torch.is_autocast_enabled(kind) or not plain_linears(*modules):
        return False
    weights = [m.weight for m in modules]
    if len({w.requires_grad for w in weights}) > 1:
        return False
    return all(w.dtype != torch.get_autocast_dtype(kind) for w in weights)


def paired_rope(x: Tensor, *modules: nn.Module) -> bool:
    """Whether `rotated_heads` may project and rotate queries and keys: plain linears of x's
    dtype, fp32 or fp64, outside autocast and torch.compile (inductor fuses the rotation
    itself), on a CPU, the one device it was measured on (there it saves some 2% of an fp32
    step, benchmarks/RESULTS.md). It costs a reordered copy of the q and k weights kept until
    backward (`rotated_heads`)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling():
        return False
    return plain_linears(*modules) and all(m.weight.dtype == x.dtype for m in modules)


def joint_linear(x: Tensor, *layers: nn.Linear) -> Tensor:
    """The outputs of several linears of one input, side by side, from one matmul over their
    stacked weights: one large GEMM is faster than several thin ones, and each layer keeps its
    own parameters (so LoRA targets, checkpoints and exports see q_proj, k_proj, ...)."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = None
    if layers[0].bias is not None:
        bias = torch.cat([layer.bias for layer in layers])  # type: ignore[misc]
    return F.linear(x, weight, bias)


FP32_ATTENTION_MAX_LEN = 256


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA, but in fp32 for short bf16 sequences on the CPU.

    PyTorch's CPU flash kernel is 2-3x slower in bf16 than in fp32 at short lengths (measured in
    benchmarks/throughput.py), so there the core runs in fp32 and the projections stay bf16.
    On GPUs and for long sequences the bf16 kernel is used unchanged.
    """
    if (
        q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and q.shape[-2] <= FP32_ATTENTION_MAX_LEN
    ):
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)
