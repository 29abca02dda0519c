"""Model adapters: what the model is, how a batch becomes its loss, and how its weights are saved.

The Trainer holds one and never asks what kind of model it trains. The rack is the first
adapter; a new model kind is one subclass registered with `@register_model_adapter("name")`
and passed to `train_from_config(config, adapter="name")` (see docs/architecture.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import Generator, nn

from stackwise.errors import StackWiseError
from stackwise.model.memory import attach_memory
from stackwise.model.routing import routing_scope
from stackwise.objectives.base import IGNORE, Batch, Objective
from stackwise.registry import Registry
from stackwise.train.hardware import training_device
from stackwise.train.routing_terms import routed_families, routing_loss, routing_metrics


class ModelAdapter(ABC):
    name = "adapter"
    # what get_model_adapter(name, model_config, training_config, device) was given
    model_config: Any = None
    training_config: Any = None
    device: torch.device | None = None

    @abstractmethod
    def build(self, plan: Any, vocab_size: int) -> nn.Module:
        """A fresh model for `plan` over a vocabulary of `vocab_size` tokens."""

    def check_data(self, data: Any) -> None:
        """Refuse data (a data spec or section) this adapter cannot train on; by default any."""
        return None

    # frozen weights a fresh build reproduces from files (a Hugging Face base): a sharded
    # checkpoint leaves them out, as a whole one does
    frozen_from_files = False

    def write_identity(self, folder: Path) -> None:  # noqa: B027 (a hook; none by default)
        """What a sharded checkpoint records of the model beside its shards (here: nothing)."""

    def check_identity(self, folder: Path) -> None:  # noqa: B027
        """Refuse a sharded checkpoint `write_identity` says belongs to another model."""

    def new_model(self, plan: Any, vocab_size: int) -> nn.Module:
        """`build`, moved to the device get_model_adapter was given (when given one)."""
        model = self.build(plan, vocab_size)
        if self.device is not None and all(p.is_floating_point() for p in model.parameters()):
            model = model.to(self.device)
        return model

    def loss(
        self, model: nn.Module, objective: Objective, batch: Batch, gen: Generator, uses_time: bool
    ) -> torch.Tensor:
        """The objective corrupts the batch (masks, noise level), the model scores it."""
        prep = objective.prepare(batch, gen)
        t = prep.t if uses_time else None
        # a cache-aware model (progressive stages) also takes the batch's stable keys
        extra = {"cache_key": batch["cache_key"]} if "cache_key" in batch else {}
        families = routed_families(model)  # what this forward routes adds its router loss
        with routing_scope([m for layers in families for m in layers], prep.attention_mask):
            logits = model(prep.inputs, prep.attention_mask, t, **extra)
        return objective.loss(logits, prep) + routing_loss(model, families)

    def step_metrics(self, model: nn.Module) -> dict[str, float]:
        """Extra train/* values logged with the loss (the last step's): routing, for MoE
        experts and memory chapters."""
        return routing_metrics(model)

    def micro_scales(self, micros: list[dict[str, torch.Tensor]], acc: Any) -> list[float]:
        """What each micro-batch's loss is multiplied by before backward: by default the mean
        over the step's micro-batches (an adapter whose loss is a sum divides by a count)."""
        return [1.0 / len(micros)] * len(micros)

    def compile(self, model: nn.Module) -> nn.Module:
        """train.compile: by default torch.compile of the whole model."""
        return torch.compile(model)  # type: ignore[return-value]

    def compile_blocker(self, model: nn.Module) -> str | None:
        """Why train.compile's auto leaves this model eager (None: nothing does)."""
        return "a whole-model compile is opt-in (train.compile: true)"

    def named_groups(self, model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """Parameter groups by name; each name's LR is `group_lr(name, train_config)`."""
        from stackwise.train.optim import model_groups

        return model_groups(model)

    def group_lr(self, name: str, tc: Any) -> float:
        return getattr(tc.group_lr, name, None) or tc.lr

    def evaluate(
        self, model: nn.Module, val_data: Any, acc: Any, tc: Any
    ) -> dict[str, float] | None:
        """Metrics on the validation data, or None for the objective's own evaluation."""
        return None

    def describe(self, model: nn.Module, plan: Any) -> str | None:
        """The model part of the run header, or None for the rack's."""
        return None

    def final_files(self, model: nn.Module, tokenizer: Any, plan: Any) -> Any:
        """A writer of extra files for the finished run's folder, or None."""
        return None

    def save(self, model: nn.Module, folder: Path) -> None:
        """The weights of a finished run or a checkpoint; atomic, never pickled."""
        from stackwise.io.trained import save_model

        save_model(model, folder)

    def load_weights(self, model: nn.Module, folder: Path) -> None:
        """Weights that `save` wrote into `folder` (a checkpoint, on resume) into `model`."""
        from stackwise.io.trained import WEIGHTS, load_weights

        path = folder / WEIGHTS

        if all(p.is_floating_point() for p in model.parameters()):
            load_weights(model, path)
            return
        from stackwise.io.checkpoints import load_weights_file
        from stackwise.quant.layers import load_quantized_state  # packed quantized weights

        state = load_weights_file(path)
        try:
            load_quantized_state(model, state)
        except (KeyError, RuntimeError) as err:
            raise StackWiseError(
                f"'{path}' does not match this model ({str(err)[:160]}). It was made with "
                "another model shape; resume with its own config."
            ) from None

    def load(self, folder: Path, read_plan: Any) -> tuple[Any, nn.Module, Any]:
        """(plan, model, tokenizer) of a run this adapter saved; `read_plan(folder)` is the
        door's reader of its config (stackwise.runs.read_plan). Loading is optional: an
        adapter without it trains and saves, and refuses when asked to load."""
        raise StackWiseError(
            f"The '{self.name}' model adapter trains and saves but cannot load a saved run: "
            "give it a load(folder, read_plan) method (see docs/architecture.md) to sample or "
            "resume."
        )


ADAPTERS: Registry[ModelAdapter] = Registry(
    "model adapter",
    "register_model_adapter",
    defaults={"growable": False},  # a rack the progressive recipe can grow stack by stack
)
MODEL_ADAPTERS = ADAPTERS.entries
# `@register_model_adapter(name)` makes `train_from_config(..., adapter=name)` work.
register_model_adapter = ADAPTERS.register
# seed 002's name of an adapter registered under another
ADAPTER_ALIASES = {"standard": "rack"}
# parts seed 002 names and no seed defines: what to do instead
UNDEFINED = {
    "multimodal": "a model of images or audio beside text, with no model, data format or "
    "batch for it described anywhere",
}


def get_model_adapter(
    name: str, model_config: Any = None, training_config: Any = None, device: Any = None
) -> ModelAdapter:
    """A new model adapter `name` ("rack", its seed name "standard", "dialogue", "hf", or
    one registered with @register_model_adapter). Seed 002's call also hands it the model and
    training sections it will train (a Trainer given the adapter takes them, and refuses other
    ones) and the device to build the model on, which must be the one this process trains on."""
    if name in UNDEFINED:
        raise StackWiseError(
            f"The '{name}' model adapter is named by the seeds but defined by none of them "
            f"({UNDEFINED[name]}), so StackWise has none. Registered adapters: "
            f"{', '.join(sorted({*ADAPTERS.names(), *ADAPTER_ALIASES}))}. To add one, subclass "
            "stackwise.ModelAdapter (build, and loss if the batch is not tokens), decorate it "
            f"with @stackwise.register_model_adapter('{name}') and ask for it by that name."
        )
    adapter = ADAPTERS.create(ADAPTER_ALIASES.get(name, name))
    if model_config is not None or training_config is not None or device is not None:
        adapter.model_config, adapter.training_config = model_config, training_config
        call = f"get_model_adapter('{name}', ..., device={device!r})"
        adapter.device = None if device is None else training_device(device, call)
        source = getattr(model_config, "source", None)
        if isinstance(adapter, RackAdapter) and source not in (None, "rack"):
            raise StackWiseError(
                f"The '{name}' model adapter builds a StackWise rack, but this model_config "
                f"loads a '{source}' model (model.source: {source}). Use "
                "get_model_adapter('hf', ...) for a Hugging Face model."
            )
    return adapter


@register_model_adapter("rack", growable=True)
class RackAdapter(ModelAdapter):
    """StackWise's own transformer: stacks of blocks between embeddings and a head."""

    def build(self, plan: Any, vocab_size: int) -> nn.Module:
        from stackwise.io.trained import build_rack

        imported = plan.model.init_from_hf
        rack = build_rack(plan, vocab_size, memory=not imported)
        if imported:
            from stackwise.io.hf_llama import load_llama_weights

            load_llama_weights(rack, imported)
            if plan.memory_on:  # gates at zero: the imported model's function, unchanged
                attach_memory(rack, plan)
        if plan.lora.enabled and plan.progressive.strategy == "end_to_end":
            from stackwise.quant.rack_qlora import adapt_rack

            adapt_rack(rack, plan.lora, plan.quant)  # QLoRA: frozen stacks, one adapter each
        return rack

    def micro_scales(self, micros: list[dict[str, torch.Tensor]], acc: Any) -> list[float]:
        """Instruction rows: each micro-batch's mean over its targets, weighted by its share
        of the step's targets on every rank (so every target weighs the same)."""
        if "labels" not in micros[0]:
            return super().micro_scales(micros, acc)
        counts = [(b["labels"] != IGNORE).sum() for b in micros]
        total = float(acc.reduce(torch.stack(counts).sum(), "sum"))
        return [float(c) * acc.num_processes / max(total, 1.0) for c in counts]

    def compile(self, model: nn.Module) -> nn.Module:
        """Regionally, block by block: on the CPU that is about 10% faster per step at a small
        vocabulary and compiles in seconds, where compiling the whole rack took 15 s and gained
        nothing (benchmarks/RESULTS.md, throughput)."""
        from stackwise.model.compiled import compile_blocks

        compile_blocks(model)
        return model

    def compile_blocker(self, model: nn.Module) -> str | None:
        from stackwise.train.compile_policy import rack_blocker

        return rack_blocker(model)

    def load(self, folder: Path, read_plan: Any) -> tuple[Any, nn.Module, Any]:
        from stackwise.io.trained import load_trained

        return load_trained(folder, read_plan)


StandardModelAdapter = RackAdapter  # seed 002's name ("standard")


@register_model_adapter("dialogue")
class DialogueModelAdapter(RackAdapter):
    """The rack on conversations (data.mode: instruction): the loss is over the assistant's
    tokens only (the chat rows' labels), each micro-batch weighted by its share of them, and
    the logs count them. A Hugging Face chat model's adapter is `hf` (model.source: hf)."""

    targets = 0  # assistant tokens scored in the last micro-batch

    def check_data(self, data: Any) -> None:
        if data.mode != "instruction":
            raise StackWiseError(
                "The 'dialogue' model adapter trains a rack on conversations, scoring the "
                f"assistant's replies; this data is '{data.mode}' text. Set data.mode: "
                "instruction (chat rows: messages, or prompt/completion), or use the "
                "'standard' adapter for plain text."
            )

    def build(self, plan: Any, vocab_size: int) -> nn.Module:
        self.check_data(plan.data)
        return super().build(plan, vocab_size)

    def loss(
        self, model: nn.Module, objective: Objective, batch: Batch, gen: Generator, uses_time: bool
    ) -> torch.Tensor:
        if "labels" not in batch:
            raise StackWiseError(
                "The 'dialogue' model adapter got a batch without reply labels; it trains on "
                "chat rows (data.mode: instruction), whose labels mark the assistant's tokens."
            )
        self.targets = int((batch["labels"] != IGNORE).sum())
        return super().loss(model, objective, batch, gen, uses_time)

    def step_metrics(self, model: nn.Module) -> dict[str, float]:
        return super().step_metrics(model) | {"train/reply_tokens": float(self.targets)}
