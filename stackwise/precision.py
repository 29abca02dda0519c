"""The precision vocabulary: every name the config, stack files, caches and quantizer use for how
numbers are stored or computed, defined once. Imports no torch until a dtype is asked for, so the
config (and `stackwise --help`) stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import torch

# how a grown stack is stored: cast (full/bf16/fp16), or frozen and packed (qlora = nf4 + LoRA)
StackPrecision = Literal["full", "bf16", "fp16", "nf4", "fp8", "nvfp4", "qlora"]
# packed formats of frozen linears: NF4 through bitsandbytes, fp8 and nvfp4 our own
QuantFormat = Literal["nf4", "fp8", "nvfp4"]
# quant.type: what stacks become once they are trunk
QuantType = Literal["nf4", "fp8", "nvfp4", "fp16", "bf16", "fp32"]
# half-precision floats: activation caches, adapters on a quantized base
HalfFloat = Literal["bf16", "fp16"]
# train.mixed_precision: autocast; auto asks the hardware probe
MixedPrecision = Literal["auto", "no", "bf16", "fp16"]
# a Hugging Face base's weights or 4-bit matmuls: auto follows the training precision
ModelDtype = Literal["auto", "fp32", "bf16", "fp16"]
# a 4-bit base's packed storage: bytes, or a float (FSDP shards floats)
Storage4bit = Literal["uint8", "bf16", "fp16", "fp32"]

STACK_PRECISIONS: tuple[str, ...] = get_args(StackPrecision)
QUANT_FORMATS: tuple[str, ...] = get_args(QuantFormat)
QUANT_TYPES: tuple[str, ...] = get_args(QuantType)
HALF_FLOATS: tuple[str, ...] = get_args(HalfFloat)
FLOAT_STORAGE = ("full", "bf16", "fp16")  # a cast: the stack still trains in it
# a stack precision that stores packed weights -> the storage format it packs into
PACKED = {"nf4": "nf4", "fp8": "fp8", "nvfp4": "nvfp4", "qlora": "nf4"}


def storage_of(precision: str) -> str:
    """What a new stack of `precision` is stored as, in quant.type's words (full is fp32 and
    qlora nf4), so the two settings can be compared."""
    return {"full": "fp32", "qlora": "nf4"}.get(precision, precision)


def torch_dtype(name: str) -> torch.dtype:
    """The floating dtype of `full`/`fp32`, `bf16` or `fp16`."""
    import torch

    table = {"full": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16}
    table["fp16"] = torch.float16
    if name not in table:
        raise ValueError(f"'{name}' is not a floating-point precision; use one of {list(table)}")
    return table[name]
