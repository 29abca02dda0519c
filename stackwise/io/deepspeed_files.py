"""A DeepSpeed run's files: the engine's partitioned checkpoints (model and optimizer state
of each process, in `<checkpoint>/deepspeed/`) and the whole weights gathered from a ZeRO-3
model for the final save."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError

ENGINE_DIR = "deepspeed"  # inside a checkpoint folder
TAG = "state"
UNIVERSAL = "universal"  # DeepSpeed's universal checkpoint of TAG, for another process count


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """While DeepSpeed reads a checkpoint, every torch.load it makes is weights_only=True:
    tensors and plain data, plus the three plain-data classes ZeRO writes (its stage enum,
    the loss scaler's settings, a partition's address); never code from a file."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    real = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        with torch.serialization.safe_globals([ZeroStageEnum, LossScaler, fragment_address]):
            return real(*args, **{**kwargs, "weights_only": True})

    torch.load = load  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load = real


def save_engine(folder: Path, optimizer: Any, frozen_from_files: bool) -> None:
    """The engine's checkpoint (partitioned model and optimizer state) into folder/deepspeed;
    every process calls it. Frozen weights a fresh build reloads are left out."""
    optimizer.engine.save_checkpoint(
        str(folder / ENGINE_DIR),
        tag=TAG,
        save_latest=False,
        exclude_frozen_parameters=frozen_from_files,
    )


def writers(folder: Path) -> int:
    """How many processes wrote the engine checkpoint in `folder`."""
    return len(list((folder / ENGINE_DIR / TAG).glob("*_optim_states.pt")))


def load_engine(folder: Path, optimizer: Any, frozen_from_files: bool) -> None:
    """What save_engine wrote, into this run's engine; every process calls it. ZeRO reads its
    partitions back into as many processes as wrote them; for another count, the checkpoint's
    universal form (DeepSpeed's converter, run by the user) is read instead."""
    engine = optimizer.engine
    written, tag = writers(folder), TAG
    if written and written != engine.world_size:
        universal = folder / ENGINE_DIR / UNIVERSAL
        if not universal.is_dir():
            raise StackWiseError(
                f"Checkpoint '{folder}' holds DeepSpeed ZeRO partitions of {written} processes "
                f"and this run has {engine.world_size}; ZeRO reads them into the same count. "
                f"Resume with {written} processes, or convert the checkpoint once with "
                "DeepSpeed's own tool (it unpickles the files: for checkpoints you trust): "
                f"python -m deepspeed.checkpoint.ds_to_universal --input_folder "
                f"{folder / ENGINE_DIR / TAG} --output_folder {universal}, then resume again."
            )
        engine._config.load_universal_checkpoint = True  # no public switch after initialize
        tag = UNIVERSAL
    groups = engine.optimizer.param_groups
    settings = [{k: v for k, v in g.items() if k != "params"} for g in groups]  # see regroup
    with weights_only_loads():
        path, _ = engine.load_checkpoint(
            str(folder / ENGINE_DIR),
            tag=tag,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
            load_module_strict=not frozen_from_files,
        )
    if tag == UNIVERSAL:
        regroup(groups, settings)
    if path is None:
        raise StackWiseError(
            f"Checkpoint '{folder}' has no readable DeepSpeed state in {ENGINE_DIR}/; it is "
            "incomplete. Resume from an earlier checkpoint, or start afresh."
        )


def regroup(groups: list[dict[str, Any]], settings: list[dict[str, Any]]) -> None:
    """The universal form keeps one param group's settings and gives them to every group
    (its learning rate too, not always the one the run stepped with): this run's own go back
    (weight decay per group); the learning rates are the LR schedule's, set when the
    checkpoint's schedule is loaded (CheckpointManager.restore)."""
    for group, own in zip(groups, settings, strict=True):
        group.update(own)


def is_engine_checkpoint(folder: Path) -> bool:
    return (folder / ENGINE_DIR).is_dir()


def partitioned(model: nn.Module) -> bool:
    """ZeRO-3 partitioned the model's parameters: each forward gathers them from every rank."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def gathered_state(model: nn.Module, main: bool) -> dict[str, torch.Tensor]:
    """A ZeRO-3 model's whole state on the main process (empty elsewhere), one parameter
    gathered at a time; every process calls it."""
    import deepspeed

    state: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):  # tied: each name
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            if main:
                state[name] = p.detach().cpu().clone()
    if main:  # the persistent buffers (not a 4-bit layer's statistics: a build makes them)
        buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
        saved = model.state_dict()
        state.update({k: saved[k].detach().cpu().clone() for k in buffers if k in saved})
    return state
