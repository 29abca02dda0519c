"""`finetuning`: a trained base model frozen, its adapters trained (the step `stackwise
finetune` runs on a Hugging Face model with LoRA or memory layers).

The trained parameters are the adapters': LoRA's (lora_A/lora_B, DoRA magnitudes), the memory
layers' (routers included) and the modules PEFT keeps trainable beside LoRA (modules_to_save).
Everything else is frozen before the optimizer is made, so the base's weights leave the run as
they came in. A model with no adapter has nothing to fine-tune this way and is refused.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from stackwise.errors import StackWiseError
from stackwise.model.memory import memory_layers
from stackwise.strategies.base import register_training_strategy
from stackwise.strategies.standard import StandardTrainingStrategy

ADAPTER_NAMES = ("lora_", "modules_to_save.")  # LoRA's parameters; PEFT's trained copies


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters fine-tuning trains: LoRA, memory layers, PEFT's modules_to_save."""
    memory = {id(p) for layer in memory_layers(model) for p in layer.parameters()}
    return [
        p
        for name, p in model.named_parameters()
        if id(p) in memory or any(part in name for part in ADAPTER_NAMES)
    ]


@register_training_strategy("finetuning")
class FinetuningStrategy(StandardTrainingStrategy):
    """The standard step over the adapters alone: the base is frozen first."""

    def prepare_model(self, model: nn.Module, adapter: Any) -> None:
        trained = {id(p) for p in adapter_parameters(model)}
        if not trained:
            total = sum(p.numel() for p in model.parameters())
            raise StackWiseError(
                f"The 'finetuning' strategy trains adapters beside a frozen base, and this "
                f"model ({total:,} parameters) has none. Give it LoRA (lora.enabled on a "
                "Hugging Face model) or memory layers (train.enabled_extensions: [memory]), or "
                "train the whole model with the 'standard' strategy."
            )
        for p in model.parameters():
            if id(p) not in trained:
                p.requires_grad_(False)
