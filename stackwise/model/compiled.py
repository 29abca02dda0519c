"""train.compile for racks, regionally: every Block of every Stack runs through one compiled
function, compiled once per input shape (blocks share their code)."""

from __future__ import annotations

from torch import Tensor, nn

from stackwise.compiling import CompiledOrEager
from stackwise.model.layers import Block, Stack
from stackwise.model.rope import Rope


def run_block(block: Block, x: Tensor, rope: Rope, mask: Tensor | None) -> Tensor:
    return block(x, rope, mask)


class CompiledBlock(CompiledOrEager):
    """run_block through one torch.compile'd function, shared by every block."""

    def __init__(self, fallback: bool = False) -> None:
        super().__init__(run_block, fallback)


def eager_on_compile_failure(model: nn.Module) -> None:
    """Let the model's compiled blocks fall back to eager if the compiler fails (auto)."""
    for stack in (m for m in model.modules() if isinstance(m, Stack)):
        if isinstance(stack.fast, CompiledBlock):
            stack.fast.fallback = True


def compile_blocks(model: nn.Module, on: bool = True) -> int:
    """train.compile, regionally: one compiled run_block serves every Block of every Stack
    (blocks share their code, so it compiles once per input shape, in seconds). Decoding with
    a KV cache stays eager. `on=False` puts the model back to eager (after training, so that
    samples and saved runs behave as `stackwise generate` will). Returns the stacks changed."""
    fast = CompiledBlock() if on else None
    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    for stack in stacks:
        stack.fast = fast
    return len(stacks)
