"""A torch.compile'd function that may go back to eager: train.compile's auto setting turns
compiling on where it has been measured to pay, and a compiler that cannot build on this
machine (no OpenMP, no Python headers, ...) must not end a run the user did not ask to compile."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch


class CompiledOrEager:
    """`fn` through torch.compile. With `fallback` (train.compile auto), a compiler failure
    puts it back to eager once, with a note, instead of ending the run."""

    def __init__(self, fn: Callable[..., Any], fallback: bool = False) -> None:
        self.eager, self.fn = fn, torch.compile(fn)
        self.fallback, self.failed = fallback, False

    def __call__(self, *args: Any) -> Any:
        if not self.failed:
            try:
                return self.fn(*args)
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
        return self.eager(*args)
