"""What trains in a growing rack: the roles of its stacks (new, trunk) and of the anchor.

Mixed into ProgressiveRackBuilder, which holds `rack`, `meta` (each stack's storage and
adapters), `grown` and `new_stack`. Roles are tracked by object identity, so prepending (which
shifts every position) never confuses the new stack with the trunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from stackwise.errors import StackWiseError
from stackwise.model.layers import Stack
from stackwise.precision import PACKED
from stackwise.quant.lora import STACK, TRUNK, adapter_names, set_adapter_trainable


def _fixed(p: nn.Parameter) -> bool:
    """Parameters that never train (the optional frozen random SwiGLU up-projection)."""
    return bool(getattr(p, "_stackwise_fixed", False))


class StackRoles:
    rack: Any
    meta: dict[Stack, Any]
    grown: list[Stack]
    new_stack: Stack | None

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
        """A float stack trains its weights and its LoRA adapters; a packed (quantized) one
        trains only through its stack adapter (its base stays frozen)."""
        meta = self.meta.get(stack)
        if meta is not None and meta.storage in PACKED:
            self._set(stack, False)
            if STACK in meta.adapters:
                set_adapter_trainable(stack, STACK, trainable)
        else:
            self._set(stack, trainable)

    def set_lora_trainable(self, stack: Stack, trainable: bool) -> None:
        """Every LoRA adapter of the stack (its own and its trunk adapter)."""
        for name in adapter_names(stack):
            set_adapter_trainable(stack, name, trainable)

    def set_trunk_adapter_trainable(self, stack: Stack, trainable: bool) -> None:
        set_adapter_trainable(stack, TRUNK, trainable)

    def set_anchor_trainable(self, trainable: bool) -> None:
        for mod in self.anchor_modules():
            self._set(mod, trainable)

    @property
    def trunk_indices(self) -> list[int]:
        """Rack positions of the trunk stacks (every stack but the new one)."""
        return [i for i, s in enumerate(self.rack.stacks) if s is not self.new_stack]

    def _at(self, indices: Sequence[int] | None) -> list[Stack]:
        if indices is None:
            return self.trunk
        stacks = list(self.rack.stacks)
        bad = [i for i in indices if not -len(stacks) <= i < len(stacks)]
        if bad:
            raise StackWiseError(
                f"Stack index {bad[0]} is not a rack position; the rack has {len(stacks)} "
                f"stacks (positions 0..{len(stacks) - 1}, see builder.trunk_indices)."
            )
        return [stacks[i] for i in indices]

    def _new_trains(self, frozen: list[Stack]) -> None:
        if self.new_stack is not None and all(s is not self.new_stack for s in frozen):
            self.set_trainable(self.new_stack, True)

    def freeze_trunk(self, trunk_indices: Sequence[int] | None = None) -> None:
        """The trunk stacks (or those at rack positions `trunk_indices`) get no gradients,
        their LoRA adapters included; the new stack trains."""
        frozen = self._at(trunk_indices)
        for stack in frozen:
            self._set(stack, False)
        self._new_trains(frozen)

    def freeze_all_but_qlora(self, trunk_indices: Sequence[int] | None = None) -> None:
        """On the trunk stacks (or those at `trunk_indices`) only the LoRA adapters train, their
        base weights frozen; the new stack trains."""
        stacks = self._at(trunk_indices)
        for stack in stacks:
            self._set(stack, False)
            self.set_lora_trainable(stack, True)
        self._new_trains(stacks)

    def freeze_all_but_lora(self) -> None:
        """Only LoRA adapter weights (PEFT's `lora_` parameters) stay trainable."""
        for name, p in self.rack.named_parameters():
            p.requires_grad_("lora_" in name and not _fixed(p))
