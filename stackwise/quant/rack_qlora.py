"""QLoRA on a whole rack trained end to end: every stack's base weights frozen (stored as
quant.type when quantization is on) under one trainable LoRA adapter per stack, while the
anchor (embeddings, final norm, head) trains as usual. It is what `lora.enabled` (with or
without `quant.enabled`) means for progressive.strategy: end_to_end; a grown rack places its
adapters stage by stage instead (stackwise.progressive).

`stack_record` reads back what a stack is (its storage and adapters) for its stack file, so a
saved rack is rebuilt with the same structure (stackwise.io.stack_files.restructure_stack).
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from stackwise.precision import FLOAT_STORAGE, QUANT_FORMATS, torch_dtype
from stackwise.quant.layers import QuantLinear, quantize_linears
from stackwise.quant.lora import (
    STACK,
    adapter_record,
    add_adapter,
    dtype_name,
    rank_for,
    set_adapter_trainable,
)
from stackwise.spec import AdapterSpec

STORAGE_OF_DTYPE = {"float32": "full", "bfloat16": "bf16", "float16": "fp16"}


def base_format(quant: Any) -> str | None:
    """How the stacks' frozen base weights are stored (quant.type), or None: as trained."""
    if not (quant.enabled and quant.backbone_quantized):
        return None
    return "full" if quant.type == "fp32" else quant.type


def adapt_rack(rack: nn.Module, lora: Any, quant: Any) -> list[AdapterSpec]:
    """Freeze and store every stack of `rack` as `quant` says and give each its adapter
    (lora.rank/alpha, per stack under lora.strategy); returns the adapters, in stack order.
    `lora` and `quant` are the plan's specs (or the config's sections)."""
    fmt = base_format(quant)
    dtype = "fp32" if not quant.enabled or quant.adapters_full_precision else "bf16"
    stacks = list(rack.stacks)  # type: ignore[attr-defined]
    made = []
    for index, stack in enumerate(stacks):
        if fmt in QUANT_FORMATS:
            for p in stack.parameters():
                p.data = p.data.float()
            quantize_linears(stack, fmt, quant.double_quant)  # type: ignore[arg-type]
        elif fmt in FLOAT_STORAGE and fmt != "full":
            for p in stack.parameters():
                p.data = p.data.to(torch_dtype(fmt))
        rank, alpha = rank_for(index, len(stacks), lora)
        spec = AdapterSpec(rank, alpha, lora.dropout, dtype)
        add_adapter(stack, STACK, spec)  # every base weight frozen, the adapter too
        set_adapter_trainable(stack, STACK, True)
        made.append(spec)
    return made


def stack_storage(stack: nn.Module) -> str:
    """What a stack's base weights are stored as: a packed format, or its float dtype."""
    for m in stack.modules():
        if isinstance(m, QuantLinear):
            return m.fmt
        if getattr(getattr(m, "weight", None), "quant_state", None) is not None:
            return "nf4"  # a bitsandbytes 4-bit linear
    norms = [p for n, p in stack.named_parameters() if n.endswith("norm.weight")]
    dtype = str((norms[0] if norms else next(stack.parameters())).dtype).removeprefix("torch.")
    return STORAGE_OF_DTYPE.get(dtype, "full")


def stack_adapters(stack: nn.Module) -> dict[str, AdapterSpec]:
    """The LoRA adapters a stack carries, by name, as their specs."""
    if "peft" not in sys.modules:  # no adapter can exist, and importing PEFT costs ~100 MB
        return {}
    from peft.tuners.lora import LoraLayer

    found: dict[str, AdapterSpec] = {}
    for m in stack.modules():
        if not isinstance(m, LoraLayer):
            continue
        for name in m.lora_A:
            drop = m.lora_dropout[name]
            found.setdefault(
                name,
                AdapterSpec(
                    int(m.r[name]),
                    float(m.lora_alpha[name]),
                    float(drop.p) if isinstance(drop, nn.Dropout) else 0.0,
                    dtype_name(m.lora_A[name].weight.dtype),
                ),
            )
    return found


def stack_record(stack: nn.Module) -> dict[str, Any]:
    """The stack file's record of how a stack is stored and adapted."""
    storage = stack_storage(stack)
    adapters = stack_adapters(stack)
    return {
        "precision": storage,
        "storage": storage,
        "adapters": {k: adapter_record(v) for k, v in sorted(adapters.items())},
    }
