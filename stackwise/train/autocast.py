"""A training forward under the run's autocast, and the dtype its outputs leave in.

Accelerate's prepare (and our FSDP2/DeepSpeed placement, which does what it does) also casts a
model's floating outputs to fp32. stackwise's own losses upcast the logits themselves
(`objectives.base.token_ce`); with train.compile on a GPU they do it inside one compiled loss
that reads the bf16 logits and never writes an fp32 copy, which the output cast would put back
in front of it (a full extra pass over the step's largest tensor, forward and backward). So
while a run's every reader of the outputs is stackwise's own, they stay in the autocast dtype;
a loss, evaluation, step or extension written outside stackwise keeps Accelerate's contract
(fp32 outputs), and so does the model once training is over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from stackwise.origin import stackwise_code


def autocast_forward(model: nn.Module, accelerator: Any) -> None:
    """What Accelerate does to a model it prepares, for models it does not prepare: forward
    under the run's autocast, floating outputs back in fp32. The unwrapped forward is kept
    where Accelerate keeps it (`_original_forward`), for `autocast_outputs`."""
    from accelerate.utils import convert_outputs_to_fp32

    forward = model.forward
    model._original_forward = forward  # type: ignore[assignment]
    model.forward = convert_outputs_to_fp32(under_autocast(forward, accelerator))  # type: ignore[method-assign]


def under_autocast(forward: Callable[..., Any], accelerator: Any) -> Callable[..., Any]:
    """`forward` run under the accelerator's autocast; `__wrapped__` names the function under
    it, as Accelerate's unwrap_model(keep_fp32_wrapper=False) follows it back."""

    def autocast(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    autocast.__wrapped__ = getattr(forward, "__func__", forward)  # type: ignore[attr-defined]
    return autocast


def readers_upcast(adapter: Any, strategy: Any, extensions: Sequence[Any] = ()) -> bool:
    """Whether everything that may read the training forward's outputs is stackwise's own
    code, which upcasts logits before it reduces them: the adapter's loss and evaluation, the
    strategy's step and the extensions (whose hooks see the model). An objective's own loss
    is upcast for it (Objective.__init_subclass__)."""
    methods = [
        type(adapter).loss,
        type(adapter).evaluate,
        type(strategy).compute_loss,
        type(strategy).train_step,
    ]
    return all(stackwise_code(m) for m in methods + [type(e) for e in extensions])


def autocast_outputs(model: nn.Module, accelerator: Any) -> Callable[[], None] | None:
    """Undo the fp32 cast of outputs on a model prepared with autocast (by Accelerate or
    `autocast_forward`): its forward still runs under the autocast, its outputs stay in the
    autocast dtype. Returns what puts the fp32 cast back (after training), or None where the
    model runs without autocast."""
    original = model.__dict__.get("_original_forward")
    if original is None or accelerator.mixed_precision == "no":
        return None
    converting = model.forward
    model.forward = under_autocast(original, accelerator)  # type: ignore[method-assign]

    def restore() -> None:
        model.forward = converting  # type: ignore[method-assign]

    return restore
