"""Compressed weight storage (nf4 via bitsandbytes; fp8 and nvfp4 our own) and PEFT LoRA."""

from stackwise.quant.layers import (
    FP8Linear,
    NVFP4Linear,
    dequantized_weight,
    pin_nf4_layout,
    quantize_linears,
    weight_bytes,
)
from stackwise.quant.lora import add_adapter, merge_adapters, rank_for

__all__ = [
    "FP8Linear",
    "NVFP4Linear",
    "add_adapter",
    "dequantized_weight",
    "merge_adapters",
    "pin_nf4_layout",
    "quantize_linears",
    "rank_for",
    "weight_bytes",
]
