"""Compressed weight storage (nf4 via bitsandbytes; fp8 and nvfp4 our own) and PEFT LoRA.

Names load on first use: the plan reads LoRA's rank rule without importing the quantized layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackwise.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    globals(),
    {
        "stackwise.quant.layers": (
            "FP8Linear",
            "NVFP4Linear",
            "dequantized_weight",
            "pin_nf4_layout",
            "quantize_linears",
            "weight_bytes",
        ),
        "stackwise.quant.lora": ("add_adapter", "merge_adapters", "rank_for"),
    },
)

if TYPE_CHECKING:  # static tools see the real names
    from stackwise.quant.layers import (  # noqa: F401
        FP8Linear,
        NVFP4Linear,
        dequantized_weight,
        pin_nf4_layout,
        quantize_linears,
        weight_bytes,
    )
    from stackwise.quant.lora import add_adapter, merge_adapters, rank_for  # noqa: F401
