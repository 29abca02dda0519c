"""LoRA adapters on a stack through PEFT, and merging them back into plain linears.

A stack can carry two adapters: `stack` (added with the stack, trained while it is new) and
`trunk` (added once when it joins a trunk that keeps adapting). Both stay active in forward;
which one trains is just `requires_grad`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from stackwise.precision import torch_dtype
from stackwise.spec import AdapterSpec, LoraSpec

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STACK, TRUNK = "stack", "trunk"
ADAPTER_DTYPES = ("fp32", "bf16", "fp16")  # the floats an adapter trains in (precision's names)
# stack files written before the adapter spec named the dtype as torch does
TORCH_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def rank_for(index: int, n_stacks: int, lora: LoraSpec) -> tuple[int, float]:
    """(rank, alpha) of stack `index`'s adapter under lora.strategy (duck-typed: the config's
    lora section reads the same)."""
    rank, alpha = lora.rank, lora.alpha
    if lora.strategy == "variable":
        setting = lora.per_stack.get(index)
        if setting is not None:
            return setting.rank, setting.alpha if setting.alpha is not None else 2.0 * setting.rank
        return rank, alpha
    if lora.strategy == "progressive":
        factor = {
            "constant": lambda: 1,
            "increasing": lambda: 2**index,
            "decreasing": lambda: 2 ** (n_stacks - 1 - index),
            "linear": lambda: index + 1,
        }
        return rank * factor[lora.rank_pattern](), alpha * factor[lora.alpha_pattern]()
    return rank, alpha


def dtype_name(dtype: str | torch.dtype) -> str:
    """An adapter dtype as AdapterSpec names it (fp32, bf16, fp16); torch's names and dtypes
    (old stack files, callers not yet on the spec) are read as the same."""
    name = str(dtype).removeprefix("torch.")
    name = TORCH_NAMES.get(name, name)
    if name not in ADAPTER_DTYPES:
        raise ValueError(f"'{dtype}' is not an adapter dtype; use one of {list(ADAPTER_DTYPES)}")
    return name


def adapter_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype an adapter's weights train in, from its spec's dtype name."""
    return torch_dtype(dtype_name(dtype))


def adapter_record(spec: AdapterSpec) -> dict[str, Any]:
    """An adapter as a stack file's metadata records it."""
    return {
        "rank": spec.rank,
        "alpha": spec.alpha,
        "dropout": spec.dropout,
        "dtype": dtype_name(spec.dtype),
    }


def adapter_from_record(record: dict[str, Any] | list[Any]) -> AdapterSpec:
    """The adapter a stack file's metadata records: `{rank, alpha, dropout, dtype}`, or the
    older `[rank, alpha, "float32"]` (no dropout: it trained without)."""
    if isinstance(record, list | tuple):
        rank, alpha, dtype = record
        return AdapterSpec(int(rank), float(alpha), 0.0, dtype_name(dtype))
    return AdapterSpec(
        int(record["rank"]),
        float(record["alpha"]),
        float(record.get("dropout", 0.0)),
        dtype_name(record.get("dtype", "fp32")),
    )


def adapter_names(module: nn.Module) -> set[str]:
    from peft.tuners.lora import LoraLayer

    names: set[str] = set()
    for m in module.modules():
        if isinstance(m, LoraLayer):
            names |= set(m.lora_A.keys())
    return names


def add_adapter(module: nn.Module, name: str, spec: AdapterSpec) -> list[nn.Parameter]:
    """Inject adapter `name`, shaped by `spec`, into every target linear of `module`; every
    adapter stays active. Returns the new adapter's parameters (trainable)."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    if name in adapter_names(module):
        raise ValueError(f"this stack already has a '{name}' adapter")
    config = LoraConfig(
        r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=TARGETS
    )
    dtype = adapter_dtype(spec.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "already found a peft_config": a second adapter
        inject_adapter_in_model(config, module, adapter_name=name)
    params = []
    for m in module.modules():
        if isinstance(m, LoraLayer):
            m.set_adapter(sorted(m.lora_A.keys()))  # keep every adapter active
            for layer in (m.lora_A[name], m.lora_B[name]):
                layer.to(dtype)
                params += list(layer.parameters())
    for p in module.parameters():  # set_adapter toggles grads; the caller decides roles
        p.requires_grad_(False)
    return params


def set_adapter_trainable(module: nn.Module, name: str, trainable: bool) -> None:
    for n, p in module.named_parameters():
        if "lora_" in n and f".{name}." in n:
            p.requires_grad_(trainable)


def lora_delta(layer: nn.Module, name: str) -> torch.Tensor:
    """What adapter `name` adds to a LoRA-wrapped linear's weight (fp32): B @ A x scaling."""
    a = layer.lora_A[name].weight.float()
    b = layer.lora_B[name].weight.float()
    return (b @ a) * layer.scaling[name]


def effective_weight(module: nn.Module) -> torch.Tensor:
    """The fp32 weight a linear computes with: its dequantized base plus every LoRA adapter's
    delta when PEFT wraps it (adapters are all active), else its (dequantized) weight."""
    from peft.tuners.lora import LoraLayer

    from stackwise.quant.layers import dequantized_weight  # not for a plan's rank_for

    if not isinstance(module, LoraLayer):
        return dequantized_weight(module)
    weight = dequantized_weight(module.get_base_layer()).clone()
    for name in module.lora_A:
        weight += lora_delta(module, name)
    return weight


def merge_adapters(module: nn.Module) -> float:
    """Replace every LoRA-wrapped linear by a plain fp32 nn.Linear holding dequantized base +
    every adapter's delta. Returns the largest |delta| merged (0 when adapters are untrained)."""
    from peft.tuners.lora import LoraLayer

    from stackwise.quant.layers import dequantized_weight

    largest = 0.0
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, LoraLayer):
                continue
            base = child.get_base_layer()
            weight = dequantized_weight(base).clone()
            for name in child.lora_A:
                delta = lora_delta(child, name)
                largest = max(largest, float(delta.abs().max()))
                weight += delta
            merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
            merged.weight.data.copy_(weight)
            if base.bias is not None:
                merged.bias.data.copy_(base.bias.detach().float())
            merged.to(weight.device)
            setattr(parent, child_name, merged)
    if hasattr(module, "peft_config"):
        del module.peft_config
    return largest
