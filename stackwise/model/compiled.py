"""train.compile for racks, regionally: every Block of every Stack runs through one compiled
function, compiled once per input shape (blocks share their code)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from stackwise.model.layers import Block, Stack
from stackwise.model.rope import Rope


def run_block(block: Block, x: Tensor, rope: Rope, mask: Tensor | None) -> Tensor:
    return block(x, rope, mask)


class CompiledBlock:
    """run_block through one torch.compile'd function. With `fallback` (train.compile auto),
    a compiler that cannot build here (no OpenMP, no Python headers, ...) puts every block
    back to eager once, with a note, instead of ending the run."""

    def __init__(self, fallback: bool = False) -> None:
        self.fn = torch.compile(run_block)
        self.fallback, self.failed = fallback, False

    def __call__(self, block: Block, x: Tensor, rope: Rope, mask: Tensor | None) -> Tensor:
        if not self.failed:
            try:
                return self.fn(block, x, rope, mask)
            except torch._dynamo.exc.BackendCompilerFailed as err:
                if not self.fallback:
                    raise
                self.failed = True
                reason = str(err.inner_exception).strip().splitlines()[0][:200]
                print(
                    f"stackwise: note: train.compile (auto) could not compile here ({reason}); "
                    "the run goes on eager. Set train.compile: false to skip the attempt.",
                    file=sys.stderr,
                )
        return run_block(block, x, rope, mask)


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
