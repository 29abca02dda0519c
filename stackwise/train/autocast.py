"""A training forward under the run's autocast, and the dtype its outputs leave in.

Accelerate's prepare (and our FSDP2/DeepSpeed placement, which does what it does) also casts a
model's floating outputs to fp32. stackwise's own losses upcast the logits themselves
(`objectives.base.token_ce`), eagerly or, with train.compile on a GPU, inside one compiled
kernel that never writes an fp32 copy: there the output cast was a full extra pass over the
step's largest tensor, forward and backward, and it fed the loss fp32 logits, whose CUDA
log-softmax is 2.8x slower (benchmarks/RESULTS.md, gpu_loss_paths and gpu_step_profile). So
their outputs stay in the autocast dtype. A loss written outside stackwise (a user's adapter or
objective) keeps Accelerate's contract: fp32 outputs.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def autocast_forward(model: nn.Module, accelerator: Any) -> None:
    """What Accelerate does to a model it prepares, for models it does not prepare: forward
    under the run's autocast, floating outputs back in fp32. The unwrapped forward is kept
    where Accelerate keeps it (`_original_forward`), for `autocast_outputs`."""
    from accelerate.utils import convert_outputs_to_fp32

    forward = model.forward
    model._original_forward = forward  # type: ignore[assignment]

    def autocast(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    model.forward = convert_outputs_to_fp32(autocast)  # type: ignore[method-assign]


def autocast_outputs(model: nn.Module, accelerator: Any) -> bool:
    """Undo the fp32 cast of outputs on a model prepared with autocast (by Accelerate or
    `autocast_forward`): its forward still runs under the autocast, its outputs stay in the
    autocast dtype. False (nothing changed) for a model run without autocast."""
    original = model.__dict__.get("_original_forward")
    if original is None or accelerator.mixed_precision == "no":
        return False

    def autocast(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return original(*args, **kwargs)

    autocast.__wrapped__ = getattr(original, "__func__", original)  # type: ignore[attr-defined]
    model.forward = autocast  # type: ignore[method-assign]
    return True
