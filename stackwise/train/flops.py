"""Training FLOPs as a step really spends them, counted where the work happens.

Forward hooks on every linear layer and every attention core add up what each call computes:
a linear costs 2 x rows x in x out in the forward pass; its backward costs as much again for the
weight's gradient when the weight trains, and again for the input's gradient when something
before it trains (autograd skips both otherwise). An attention core costs 4 x batch x heads x
queries x keys x head_dim (scores and their weighted sum; causal attention is counted whole, as
the PaLM and nanoGPT MFU formulas count it) and twice that backward when its inputs need
gradients. So the count follows the run as it is: a frozen trunk costs its forward only, a
cached trunk nothing on a hit (it is not run), LoRA adapters their own small matrices plus the
frozen base's input gradients, an MoE layer the experts its tokens were routed to.

Elementwise work (norms, activations, RoPE, the loss) and the optimizer are not counted, as in
the usual 6N estimates; evaluations are not training compute and are not counted either. A
block recomputed in the backward pass (gradient checkpointing) costs its forward again. A plain
block (dense linears only) is counted from its stack's hook by the same rules
without a hook per layer (`block_cost`), which would cost a call per layer and keep q/k/v and
gate/up from running as one matmul; so are blocks run compiled, which hide their layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from stackwise.model.layers import Block, Stack, plain_block
from stackwise.model.rack import TiedHead
from stackwise.train.state import Stage, TrainState


def attention_shape(module: nn.Module) -> tuple[int, int] | None:
    """(query heads, head dim) of an attention module: ours, or a Hugging Face one (a class
    named ...Attention with head_dim and its config's num_attention_heads); None otherwise."""
    heads = getattr(module, "n_heads", None)
    if heads is None and type(module).__name__.endswith("Attention"):
        heads = getattr(getattr(module, "config", None), "num_attention_heads", None)
    head_dim = getattr(module, "head_dim", None)
    if isinstance(heads, int) and isinstance(head_dim, int):
        return heads, head_dim
    return None


def linear_shape(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a linear layer: nn.Linear and its subclasses (our quantized layers,
    bitsandbytes' Linear4bit/8bit), or transformers' Conv1D (GPT-2), whose weight is (in, out)."""
    if isinstance(module, nn.Linear | TiedHead):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


class FlopMeter:
    """Counts the training FLOPs of the modules it is attached to, while `counting()`."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.forward = 0.0
        self.backward = 0.0
        self.on = False
        self._stack_start = 0.0
        self._handles: list[Any] = []
        self._whole: set[int] = set()
        if model is not None:
            self.attach(model)

    @property
    def total(self) -> float:
        return self.forward + self.backward

    def attach(self, model: nn.Module) -> None:
        whole = {id(b) for s in model.modules() if isinstance(s, Stack) for b in counted_whole(s)}
        self._whole = whole
        inside = {id(m) for b in model.modules() if id(b) in whole for m in b.modules()}
        for module in model.modules():
            if isinstance(module, Stack):
                self._handles.append(module.register_forward_pre_hook(self._stack_begins))
                self._handles.append(module.register_forward_hook(self._stack_done))
            if id(module) in inside:
                continue  # counted by its stack: a hook would also keep its linears unfused
            if linear_shape(module) is not None:
                self._handles.append(module.register_forward_hook(self._linear))
            elif attention_shape(module) is not None:
                hook = module.register_forward_hook(self._attention, with_kwargs=True)
                self._handles.append(hook)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @contextmanager
    def counting(self) -> Iterator[FlopMeter]:
        was, self.on = self.on, True
        try:
            yield self
        finally:
            self.on = was

    def _linear(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if torch.compiler.is_compiling() or not self.on or not args:
            return
        x = args[0]
        if not isinstance(x, torch.Tensor):
            return
        n_in, n_out = linear_shape(module) or (1, 0)
        cost = 2.0 * (x.numel() // n_in) * n_in * n_out
        self.forward += cost
        if _backward_follows(output):
            self.backward += cost * (module.weight.requires_grad + x.requires_grad)

    def _stack_begins(self, stack: nn.Module, args: tuple[Any, ...]) -> None:
        self._stack_start = self.forward

    def _stack_done(self, stack: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Count the blocks counted whole, and every block of a stack whose hooks counted
        nothing (its blocks ran compiled)."""
        if not self.on or not args:
            return
        hooked_nothing = self.forward == self._stack_start
        x, follows = args[0], _backward_follows(output)
        recomputed = follows and stack.gradient_checkpointing and stack.training
        for block in stack.blocks:
            if hooked_nothing or id(block) in self._whole:
                forward, backward = block_cost(block, x, follows)
                self.forward += forward
                self.backward += backward
                if recomputed:  # torch's checkpoint stops once it has what backward needs:
                    self.backward += forward - _linear_cost(block.ffn.down_proj, x)  # not its last

    def _attention(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if torch.compiler.is_compiling() or not self.on:
            return
        x = args[0] if args else kwargs.get("hidden_states")
        x = x if isinstance(x, torch.Tensor) else None
        shape = attention_shape(module)
        if x is None or shape is None or x.dim() != 3:
            return
        heads, head_dim = shape
        batch, length = x.shape[0], x.shape[1]
        cost = 4.0 * batch * heads * length * length * head_dim
        self.forward += cost
        out = output[0] if isinstance(output, tuple | list) and output else output
        if _backward_follows(out) and _needs_input_grads(module, x):
            self.backward += 2.0 * cost


def _backward_follows(output: Any) -> bool:
    """Whether this forward call will be back-propagated: grad mode is on, the output needs a
    gradient, and the call is not a checkpointed block's recomputation (which runs inside the
    backward pass that it serves, and so costs its forward only)."""
    if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor):
        return False
    return output.requires_grad and torch._C._current_graph_task_id() == -1


def _linear_cost(module: nn.Module, x: torch.Tensor) -> float:
    n_in, n_out = linear_shape(module) or (0, 0)
    return 2.0 * (x.numel() // x.shape[-1]) * n_in * n_out


def counted_whole(stack: Stack) -> list[nn.Module]:
    """The blocks counted by `block_cost` from their stack's hook instead of a hook per layer:
    the plain ones (layers.plain_block). A checkpointed stack's blocks add their forward again
    but the last matmul, which the recomputation in the backward pass stops before."""
    return [block for block in stack.blocks if plain_block(block)]


def block_cost(block: Block, x: torch.Tensor, backward: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs of one block on `x` by the hooks' rules, without running it:
    for blocks run compiled. Every linear's input is taken to need a gradient when the block's
    input does or any of its weights trains (exact for whole blocks, trained or frozen)."""
    tokens = x.numel() // x.shape[-1]
    grad_in = x.requires_grad or any(p.requires_grad for p in block.parameters())
    forward = backward_cost = 0.0
    for module in block.modules():
        shape = linear_shape(module)
        if shape is not None:
            cost = 2.0 * tokens * shape[0] * shape[1]
            forward += cost
            backward_cost += cost * (module.weight.requires_grad + grad_in)
    heads, head_dim = attention_shape(block.attn) or (0, 0)
    attention = 4.0 * x.shape[0] * heads * x.shape[1] ** 2 * head_dim
    forward += attention
    backward_cost += 2.0 * attention if grad_in else 0.0
    return forward, backward_cost if backward else 0.0


def _needs_input_grads(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether queries, keys or values need gradients: the input does, or a projection that
    makes them trains (the output projection alone does not reach the core)."""
    if x.requires_grad:
        return True
    return any(
        p.requires_grad
        for name, p in module.named_parameters()
        if not name.startswith(("o_proj", "out_proj", "dense", "c_proj"))
    )


def run_compute(stage: Stage, state: TrainState) -> dict[str, float | int]:
    """The logged compute: the whole run's training FLOPs so far (a progressive stage's include
    the stages before it) and, in a stage, the run's tokens (train/tokens are the stage's)."""
    row: dict[str, float | int] = {"train/flops": stage.flops_before + state.flops}
    if stage.index is not None or stage.tokens_before:
        row["train/run_tokens"] = stage.tokens_before + state.tokens_seen
    return row
