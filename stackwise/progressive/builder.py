"""ProgressiveRackBuilder: grows one Rack stack by stack and decides what trains.

The builder owns a single Rack from the start (embeddings, time embedding, norm and head, with
no stacks) and inserts stacks into it, so the rack that trains is the rack that is saved: there
is never a second head or a copy. Roles are tracked by object identity, so prepending (which
shifts every index) never confuses the new stack with the trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stackwise.errors import StackWiseError
from stackwise.growth import Growth, grow_stack, growth_generator
from stackwise.model.layers import Stack
from stackwise.model.rack import Rack
from stackwise.precision import FLOAT_STORAGE, PACKED, STACK_PRECISIONS, StackPrecision, torch_dtype
from stackwise.progressive.roles import StackRoles
from stackwise.progressive.seed_builder import precision_name, seed_settings
from stackwise.quant.layers import quantize_linears
from stackwise.quant.lora import (
    STACK,
    TRUNK,
    adapter_names,
    adapter_record,
    add_adapter,
    dtype_name,
)
from stackwise.registry import GROWTH_OPERATORS
from stackwise.spec import AdapterSpec, ModelSpec

Precision = StackPrecision
QUANTIZED = PACKED  # a packed precision -> its storage format


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


class ProgressiveRackBuilder(StackRoles):
    def __init__(
        self,
        spec: ModelSpec | None = None,
        vocab_size: int | None = None,
        causal: bool | None = None,
        *,
        building_mode: Literal["append", "prepend"] | None = None,
        num_time_steps: int | None = None,
        double_quant: bool = False,
        growth_operator: str = "random",
        growth_noise: float = 0.0,
        config: Any = None,
        default_precision: str | None = None,
        max_stacks: int | None = None,
        **shape: Any,
    ) -> None:
        """`growth_operator` names how a new stack is initialised (stackwise.growth), and
        `growth_noise` the noise added after it. The seeds' ways are taken too: `config=`
        (every setting read from a config, through stackwise.fronts.progressive), or the rack's
        shape as keywords (`vocab_size=..., d_model=..., d_ff=..., n_heads=...`), the rest
        filled in by a ProgressiveTrainer (seed_builder.bind). `default_precision` is what
        append_stack/prepend_stack use when no precision is given."""
        given = seed_settings(config, spec, vocab_size, causal, shape)
        self.seed = given  # what the seed's call fixed (checked when a trainer adopts it)
        mode = building_mode or given.get("building_mode") or "append"
        self.spec: ModelSpec = given.get("spec", spec)
        self.vocab_size: int = given.get("vocab_size", vocab_size)
        self.causal: bool = given.get("causal", causal)
        self.building_mode: Literal["append", "prepend"] = mode
        self.mode_given = building_mode is not None
        noise = given.get("growth_noise", growth_noise)
        self.set_growth(given.get("growth_operator", growth_operator), noise)
        self.double_quant = given.get("double_quant", double_quant)  # nf4: quantize the scales too
        steps = given.get("num_time_steps", num_time_steps)
        self.default_precision = precision_name(
            default_precision or given.get("default_precision", "full")
        )
        self.max_stacks: int | None = max_stacks or given.get("max_stacks")
        self.stack_adapters: dict[int, AdapterSpec] = given.get("stack_adapters", {})
        self.default_adapter: AdapterSpec | None = given.get("default_adapter")
        self.trunk_adapter: AdapterSpec | None = given.get("trunk_adapter")
        self.rack = Rack(self.spec, self.vocab_size, self.causal, steps, n_stacks=0)
        self.new_stack: Stack | None = None
        self.grown: list[Stack] = []  # in the order they were grown (growth index)
        self.meta: dict[Stack, StackMeta] = {}  # keyed by the stack itself (held here)

    # -- growing ------------------------------------------------------------------------------

    def set_growth(self, operator: str, noise: float = 0.0) -> None:
        """The growth operator, by name (an unknown one fails now), and the noise after it."""
        if noise < 0:
            raise StackWiseError(
                f"growth_noise is {noise}; it is a standard deviation in units of "
                "model.init_std, so it must be 0 (exact copies) or more."
            )
        self.grow = GROWTH_OPERATORS.get(operator, "growth_operator")
        self.growth_init, self.growth_noise = operator, float(noise)

    def _build(
        self,
        index: int,
        n_blocks: int | None,
        precision: str | None,
        adapter: AdapterSpec | None,
        position: int,
    ) -> Stack:
        """Stack `index` (growth order) as this builder grows it: initialised by the growth
        operator (for rack `position`), stored in `precision`, with its stack adapter; not yet
        in the rack."""
        precision = precision_name(precision or self.default_precision)
        if precision not in STACK_PRECISIONS:
            known = sorted(STACK_PRECISIONS)
            raise ValueError(f"precision '{precision}' is not one of {known}")
        adapter = adapter or self.stack_adapters.get(index)
        if precision in QUANTIZED and adapter is None:
            adapter = self.default_adapter
            if adapter is None:
                raise ValueError(
                    f"a '{precision}' stack stores frozen weights; give it an adapter to train"
                )
        stack = Stack(self.spec, self.causal, n_blocks, index=index)
        grow_stack(self.grow, self.growth(stack, index, position))
        for p in stack.parameters():
            if not p.requires_grad:
                p._stackwise_fixed = True  # type: ignore[attr-defined]
        stack.to(device=self.rack.embed_tokens.weight.device)
        self.meta[stack] = StackMeta(precision)
        self.store_as(stack, QUANTIZED.get(precision, precision))
        if adapter is not None:
            self.add_adapter(stack, STACK, adapter)
        return stack

    def growth(self, stack: Stack, index: int, position: int) -> Growth:
        """What the growth operator is told about the stack it starts (stackwise.growth)."""
        return Growth(
            stack=stack,
            trunk=tuple(self.rack.stacks),
            grown=tuple(self.grown),
            position=position,
            index=index,
            rack=self.rack,
            noise=self.growth_noise,
            generator=growth_generator(index),
        )

    def create_stack(
        self, stack_id: int, n_blocks: int | None = None, precision: str | None = None
    ) -> Stack:
        """A stack made as stack `stack_id` would be grown (its initialisation, precision and
        LoRA adapter), outside the rack: the seeds' create_stack_from_config."""
        at = 0 if self.building_mode == "prepend" else len(self.rack.stacks)
        return self._build(stack_id, n_blocks, precision, None, at)

    def append_stack(
        self,
        n_blocks: int | None = None,
        precision: str | None = None,
        adapter: AdapterSpec | None = None,
    ) -> Stack:
        """A new stack after the trunk (next to the head): the trunk's output feeds it."""
        return self.add_stack(n_blocks, precision, adapter, "append", trunk_adapters=True)

    def prepend_stack(
        self,
        n_blocks: int | None = None,
        precision: str | None = None,
        adapter: AdapterSpec | None = None,
    ) -> Stack:
        """A new stack before the trunk (next to the embeddings): it feeds the trunk."""
        return self.add_stack(n_blocks, precision, adapter, "prepend", trunk_adapters=True)

    def add_stack(
        self,
        n_blocks: int | None = None,
        precision: str | None = None,
        adapter: AdapterSpec | None = None,
        mode: Literal["append", "prepend"] | None = None,
        trunk_adapters: bool = False,
    ) -> Stack:
        """A new stack where `mode` (default: the builder's building_mode) puts it. With
        `trunk_adapters` the stacks already grown get the builder's trunk adapter (the seeds'
        progressive_qlora) once; a progressive run adds them itself (GrowingRack.set_roles)."""
        if self.max_stacks is not None and len(self.grown) >= self.max_stacks:
            raise StackWiseError(
                f"This rack already has its {self.max_stacks} stacks (max_stacks, the config's "
                "model.n_stacks); raise training.progressive.max_stacks to grow it further."
            )
        append = (mode or self.building_mode) == "append"
        at = len(self.rack.stacks) if append else 0
        stack = self._build(len(self.grown), n_blocks, precision, adapter, at)
        if trunk_adapters and self.trunk_adapter is not None:
            for old in self.grown:
                self.ensure_trunk_adapter(old, self.trunk_adapter)
        self.grown.append(stack)
        self.new_stack = stack
        if append:
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
            for name, p in stack.named_parameters():
                if "lora_" not in name:  # adapters keep their own dtype
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

    def cached_activations(self, dtype: str = "bf16", max_bytes: int | None = None) -> Any:
        """The trunk's activations, streamed through it and kept in an activation cache: what a
        ProgressiveDataLoader reads (`trunk_activations=`)."""
        from stackwise.progressive.trunk import TrunkActivations

        return TrunkActivations(self.rack, dtype=dtype, max_bytes=max_bytes)

    def trainable_names(self) -> set[str]:
        return {n for n, p in self.rack.named_parameters() if p.requires_grad}

    def build_rack(self) -> Rack:
        """The very rack that was trained (same modules, same head, same embeddings)."""
        return self.rack
