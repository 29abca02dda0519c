"""Frozen quantized linears, and turning a stack's linears into them.

`nf4` is bitsandbytes' `Linear4bit` (it runs on the CPU); `fp8` and `nvfp4` are ours
(`stackwise.quant.formats`). Our layers subclass `nn.Linear` so that PEFT wraps them with LoRA
like any linear; their `weight` is the packed codes as a frozen uint8 tensor (an integer dtype,
so PEFT never casts adapters to it) and forward dequantizes to the input's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stackwise.precision import QUANT_FORMATS, QuantFormat
from stackwise.quant.formats import (
    dequantize_fp8,
    dequantize_nvfp4,
    quantize_fp8,
    quantize_nvfp4,
)


class _FrozenDequantMatmul(torch.autograd.Function):
    """x @ W.T with W dequantized on the fly in forward AND backward, so autograd keeps only
    the compressed codes, never a full-precision copy of the weight (W is frozen: no dW)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
        ctx.layer = layer
        return F.linear(x, layer.dequantize(x.dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad @ ctx.layer.dequantize(grad.dtype), None


class QuantLinear(nn.Linear):
    """Base of our frozen compressed linears: no fp weight is kept, only codes and scales."""

    fmt = ""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None
        if linear.bias is not None:
            self.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled() else x.dtype
        out = _FrozenDequantMatmul.apply(x.to(dtype), self)
        return out + self.bias.to(dtype) if self.bias is not None else out

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, format={self.fmt}"


class FP8Linear(QuantLinear):
    fmt = "fp8"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        codes, scale = quantize_fp8(linear.weight)
        self.weight = nn.Parameter(codes.view(torch.uint8), requires_grad=False)
        self.register_buffer("scale", scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp8(self.weight.view(torch.float8_e4m3fn), self.scale, dtype)


class NVFP4Linear(QuantLinear):
    fmt = "nvfp4"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        packed, block_scale, tensor_scale = quantize_nvfp4(linear.weight)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.register_buffer("block_scale", block_scale.view(torch.uint8))
        self.register_buffer("tensor_scale", tensor_scale.reshape(1))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        scales = self.block_scale.view(torch.float8_e4m3fn)
        return dequantize_nvfp4(self.weight, scales, self.tensor_scale[0], dtype, self.in_features)


def pin_nf4_layout(module: nn.Module) -> int:
    """Keep every bitsandbytes 4-bit linear in `module` off bitsandbytes' packed CPU layout.

    On CPUs with AVX512-BF16, `Linear4bit.forward` in eval mode without gradients repacks its
    weight for a bf16 kernel: absmax is rounded to bf16 and transposed, the packing asserts
    out_features % 32 == 0 and in_features >= 64, and `state_dict()` only half undoes it (the
    absmax stays rounded and transposed), so the effective weights drift after one eval pass.
    Pinned layers always take the standard dequantize-and-matmul path, on every CPU, which is
    also the path training takes. Returns how many layers were pinned.
    """
    import bitsandbytes as bnb

    count = 0
    for m in module.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False
            count += 1
    return count


def tie_4bit_weights(module: nn.Module) -> None:
    """Each bitsandbytes 4-bit weight tied to the layer that holds it (Params4bit's `module`,
    where a gathered shard finds its statistics). A deepcopy keeps the original's tie."""
    for m in module.modules():
        if hasattr(getattr(m, "weight", None), "quant_state") and hasattr(m.weight, "module"):
            m.weight.module = m


def place_quant_states(module: nn.Module, device: torch.device) -> None:
    """Every bitsandbytes 4-bit layer's statistics onto `device`, where its weight computes.
    A sharder moves only parameters; the statistics a gathered weight is given back
    (Params4bit's `module` tie) would stay where the layer was built."""
    for m in module.modules():
        state = getattr(m, "quant_state", None)
        if state is not None and hasattr(state, "to"):
            state.to(device)


def nf4_linear(linear: nn.Linear, double_quant: bool = False) -> nn.Module:
    """bitsandbytes NF4: quantized when moved to its device (`.to` runs the quantizer)."""
    import bitsandbytes as bnb

    q = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=torch.float32,
        quant_type="nf4",
        compress_statistics=double_quant,
        device="meta",
    )
    q.weight = bnb.nn.Params4bit(
        linear.weight.detach().float().cpu(),
        requires_grad=False,
        quant_type="nf4",
        compress_statistics=double_quant,
        module=q,  # the statistics live on the layer too: a sharder's gathered copy lacks them
    )
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().float().cpu(), requires_grad=False)
    pin_nf4_layout(q)
    return q.to(linear.weight.device)


def dequantized_weight(module: nn.Module) -> torch.Tensor:
    """The fp32 weight a (possibly quantized) linear computes with."""
    if isinstance(module, QuantLinear):
        return module.dequantize(torch.float32)
    weight = module.weight
    if getattr(weight, "quant_state", None) is not None:  # bitsandbytes 4-bit
        import bitsandbytes.functional as bf

        if getattr(weight.quant_state, "packing_format_for_cpu", False):
            raise RuntimeError(
                "a bitsandbytes 4-bit layer was repacked for its CPU bf16 kernel, whose layout "
                "cannot be dequantized exactly; call pin_nf4_layout(model) right after loading"
            )
        # reshape: bitsandbytes returns a weight of <= 2 elements transposed
        return (
            bf.dequantize_4bit(weight.data, weight.quant_state)
            .float()
            .reshape(weight.quant_state.shape)
        )
    return weight.detach().float()


def quantize_linears(module: nn.Module, fmt: QuantFormat, double_quant: bool = False) -> int:
    """Replace every nn.Linear inside `module` by its frozen `fmt` version; returns the count."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantization format '{fmt}'; use one of {QUANT_FORMATS}")
    count = 0
    for name, child in list(module.named_children()):
        if name.startswith("lora_"):  # PEFT's adapter linears stay trainable fp
            continue
        if type(child) is nn.Linear:
            if fmt == "nf4":
                new: nn.Module = nf4_linear(child, double_quant)
            elif fmt == "fp8":
                new = FP8Linear(child)
            else:
                new = NVFP4Linear(child)
            setattr(module, name, new)
            count += 1
        else:
            count += quantize_linears(child, fmt, double_quant)
    return count


def weight_bytes(module: nn.Module) -> tuple[int, int]:
    """(bytes stored for linear weights incl. scales, number of weights they represent)."""
    stored = params = 0
    for name, m in module.named_modules():
        # PEFT's adapter weights are trainable extras, and its wrapper only points at base_layer
        if "lora_" in name or hasattr(m, "base_layer"):
            continue
        if isinstance(m, QuantLinear):
            stored += sum(
                t.numel() * t.element_size() for n, t in m.state_dict().items() if n != "bias"
            )
            params += m.in_features * m.out_features
        elif type(m) is nn.Linear:
            stored += m.weight.numel() * m.weight.element_size()
            params += m.weight.numel()
        elif getattr(getattr(m, "weight", None), "quant_state", None) is not None:
            w = m.weight
            qs = w.quant_state
            stored += w.data.numel() * w.data.element_size()
            stored += qs.absmax.numel() * qs.absmax.element_size()
            if getattr(qs, "state2", None) is not None:
                stored += qs.state2.absmax.numel() * qs.state2.absmax.element_size()
                stored += qs.state2.code.numel() * qs.state2.code.element_size()
            params += m.in_features * m.out_features
    return stored, params


def load_quantized_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """`module.load_state_dict(state)` that also restores bitsandbytes 4-bit weights, whose
    quantization statistics are saved as extra `weight.*` keys that torch does not load."""
    import bitsandbytes as bnb

    state = dict(state)
    for prefix, m in module.named_modules():
        if not isinstance(m, bnb.nn.Linear4bit):
            continue
        key = f"{prefix}.weight" if prefix else "weight"
        stats = {k[len(key) + 1 :]: state.pop(k) for k in list(state) if k.startswith(key + ".")}
        device = m.weight.device if m.weight.device.type != "meta" else torch.device("cpu")
        m.weight = bnb.nn.Params4bit.from_prequantized(
            state.pop(key), stats, requires_grad=False, device=device, module=m
        )
        m.support_avx512bf16_for_cpu = False  # see pin_nf4_layout
    loaded = {
        f"{p}.weight" if p else "weight"
        for p, m in module.named_modules()
        if isinstance(m, bnb.nn.Linear4bit)
    }
    result = module.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k not in loaded]
    if missing or result.unexpected_keys:
        raise KeyError(
            f"state mismatch: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
        )
