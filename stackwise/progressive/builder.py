"""ProgressiveRackBuilder: grows one Rack stack by stack and decides what trains.

The builder owns a single Rack from the start (embeddings, time embedding, norm and head, with
no stacks) and inserts stacks into it, so the rack that trains is the rack that is saved: there
is never a second head or a copy. Roles are tracked by object identity, so prepending (which
shifts every index) never confuses the new stack with the trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from torch import nn

from stackwise.model.layers import Stack
from stackwise.model.rack import Rack
from stackwise.precision import FLOAT_STORAGE, PACKED, STACK_PRECISIONS, StackPrecision, torch_dtype
from stackwise.quant.layers import quantize_linears
from stackwise.quant.lora import (
    STACK,
    TRUNK,
    adapter_names,
    adapter_record,
    add_adapter,
    dtype_name,
    set_adapter_trainable,
)
from stackwise.registry import GROWTH_OPERATORS
from stackwise.spec import AdapterSpec, ModelSpec

Precision = StackPrecision
QUANTIZED = PACKED  # a packed precision -> its storage format


def _fixed(p: nn.Parameter) -> bool:
    """Parameters that never train (the optional frozen random SwiGLU up-projection)."""
    return bool(getattr(p, "_stackwise_fixed", False))


@dataclass
class StackMeta:
    """What the builder knows of a grown stack, and what its saved metadata records."""

    precision: str  # what it trained in
    storage: str = "full"  # how its base weights are stored now
    adapters: dict[str, AdapterSpec] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "storage": self.storage,
            "adapters": {k: adapter_record(v) for k, v in self.adapters.items()},
        }


class ProgressiveRackBuilder:
    def __init__(
        self,
        spec: ModelSpec,
        vocab_size: int,
        causal: bool,
        *,
        building_mode: Literal["append", "prepend"] = "append",
        num_time_steps: int | None = None,
        double_quant: bool = False,
        growth_operator: str = "random",
    ) -> None:
        """`growth_operator` names how a new stack is initialised (stackwise.growth)."""
        self.spec = spec
        self.grow = GROWTH_OPERATORS.get(growth_operator, "growth_operator")  # unknown: fail now
        self.double_quant = double_quant  # nf4: quantize the block scales too
        self.causal = causal
        self.building_mode = building_mode
        self.rack = Rack(spec, vocab_size, causal, num_time_steps, n_stacks=0)
        self.new_stack: Stack | None = None
        self.grown: list[Stack] = []  # in the order they were grown (growth index)
        # keyed by the stack itself (held here, so no key is ever another stack's)
        self.meta: dict[Stack, StackMeta] = {}

    # -- growing ------------------------------------------------------------------------------

    def _make_stack(
        self, n_blocks: int | None, precision: Precision, adapter: AdapterSpec | None
    ) -> Stack:
        if precision not in STACK_PRECISIONS:
            known = sorted(STACK_PRECISIONS)
            raise ValueError(f"precision '{precision}' is not one of {known}")
        if precision in QUANTIZED and adapter is None:
            raise ValueError(
                f"a '{precision}' stack stores frozen weights; give it an adapter to train"
            )
        stack = Stack(self.spec, self.causal, n_blocks, index=len(self.grown))
        self.grow(stack, list(self.rack.stacks), self.rack)
        for p in stack.parameters():
            if not p.requires_grad:
                p._stackwise_fixed = True  # type: ignore[attr-defined]
        device = self.rack.embed_tokens.weight.device
        stack.to(device=device)
        self.meta[stack] = StackMeta(precision)
        self.store_as(stack, QUANTIZED.get(precision, precision))
        if adapter is not None:
            self.add_adapter(stack, STACK, adapter)
        self.grown.append(stack)
        self.new_stack = stack
        return stack

    def append_stack(
        self,
        n_blocks: int | None = None,
        precision: Precision = "full",
        adapter: AdapterSpec | None = None,
    ) -> Stack:
        """A new stack after the trunk (next to the head): the trunk's output feeds it."""
        return self.add_stack(n_blocks, precision, adapter, "append")

    def prepend_stack(
        self,
        n_blocks: int | None = None,
        precision: Precision = "full",
        adapter: AdapterSpec | None = None,
    ) -> Stack:
        """A new stack before the trunk (next to the embeddings): it feeds the trunk."""
        return self.add_stack(n_blocks, precision, adapter, "prepend")

    def add_stack(
        self,
        n_blocks: int | None = None,
        precision: Precision = "full",
        adapter: AdapterSpec | None = None,
        mode: Literal["append", "prepend"] | None = None,
    ) -> Stack:
        """A new stack where `mode` (default: the builder's building_mode) puts it."""
        stack = self._make_stack(n_blocks, precision, adapter)
        if (mode or self.building_mode) == "append":
            self.rack.stacks.append(stack)
        else:
            self.rack.stacks.insert(0, stack)
        return stack

    # -- storage and adapters -----------------------------------------------------------------

    def store_as(self, stack: Stack, fmt: str) -> None:
        """Store the stack's base weights as `fmt`: full/bf16/fp16/fp32 (a cast, norms
        included) or nf4/fp8/nvfp4 (frozen quantized linears; norms stay fp32)."""
        fmt = "full" if fmt == "fp32" else fmt
        current = self.meta[stack].storage
        if fmt == current:
            return
        if current in QUANTIZED:
            raise ValueError(f"this stack is already stored as {current}; it cannot become {fmt}")
        if fmt in FLOAT_STORAGE:
            for name, p in stack.named_parameters():
                if "lora_" not in name:
                    p.data = p.data.to(torch_dtype(fmt))
        else:
            for p in stack.parameters():
                p.data = p.data.float()
            quantize_linears(stack, fmt, self.double_quant)  # type: ignore[arg-type]
        self.meta[stack].storage = fmt

    def add_adapter(self, stack: Stack, name: str, spec: AdapterSpec) -> None:
        """A PEFT LoRA adapter on every linear of the stack; at most one per name."""
        spec = replace(spec, dtype=dtype_name(spec.dtype))  # a torch dtype, from older callers
        add_adapter(stack, name, spec)
        self.meta[stack].adapters[name] = spec

    def ensure_trunk_adapter(self, stack: Stack, spec: AdapterSpec) -> bool:
        """Give a trunk stack its trunk adapter once; later stages reuse it. True if created."""
        if TRUNK in adapter_names(stack):
            return False
        self.add_adapter(stack, TRUNK, spec)
        return True

    # -- roles --------------------------------------------------------------------------------

    @property
    def trunk(self) -> list[Stack]:
        """Every stack except the new one, in rack order."""
        return [s for s in self.rack.stacks if s is not self.new_stack]

    def position(self, stack: Stack) -> int:
        for i, s in enumerate(self.rack.stacks):
            if s is stack:
                return i
        raise ValueError("this stack is not part of the rack")

    def growth_index(self, stack: Stack) -> int:
        return next(i for i, s in enumerate(self.grown) if s is stack)

    def anchor_modules(self) -> list[nn.Module]:
        """Embeddings, time embedding, final norm and (untied) head: shared by every stack."""
        mods: list[nn.Module] = [self.rack.embed_tokens, self.rack.norm]
        if self.rack.time_embed is not None:
            mods.append(self.rack.time_embed)
        if self.rack.lm_head is not None:
            mods.append(self.rack.lm_head)
        return mods

    @staticmethod
    def _set(module: nn.Module, trainable: bool) -> None:
        for p in module.parameters():
            # integer tensors are packed quantized codes: never trainable
            p.requires_grad_(trainable and not _fixed(p) and p.is_floating_point())

    def set_trainable(self, stack: Stack, trainable: bool) -> None:
        """A stack with a stack adapter trains through it (its base stays frozen)."""
        if stack in self.meta and STACK in self.meta[stack].adapters:
            self._set(stack, False)
            set_adapter_trainable(stack, STACK, trainable)
        else:
            self._set(stack, trainable)

    def set_trunk_adapter_trainable(self, stack: Stack, trainable: bool) -> None:
        set_adapter_trainable(stack, TRUNK, trainable)

    def set_anchor_trainable(self, trainable: bool) -> None:
        for mod in self.anchor_modules():
            self._set(mod, trainable)

    def freeze_trunk(self) -> None:
        """Trunk stacks get no gradients (adapters included); the new stack trains."""
        for stack in self.trunk:
            self._set(stack, False)
        if self.new_stack is not None:
            self.set_trainable(self.new_stack, True)

    def freeze_all_but_lora(self) -> None:
        """Only LoRA adapter weights (PEFT's `lora_` parameters) stay trainable."""
        for name, p in self.rack.named_parameters():
            p.requires_grad_("lora_" in name and not _fixed(p))

    def trainable_names(self) -> set[str]:
        return {n for n, p in self.rack.named_parameters() if p.requires_grad}

    def build_rack(self) -> Rack:
        """The very rack that was trained (same modules, same head, same embeddings)."""
        return self.rack
