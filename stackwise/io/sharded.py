"""A sharded run's files: DCP (torch.distributed.checkpoint) checkpoints and the whole
weights gathered for the final save.

Under FSDP2 each process holds a shard of every parameter and of its optimizer state. A
checkpoint keeps them sharded: every process writes its own part into `<checkpoint>/sharded/`
(DCP's format), and DCP reads them back into any number of processes (resharding), or into one
process that does not shard at all. The finished run's `model.safetensors` is whole: the
shards are gathered onto rank 0, so every other command reads it as it reads any run.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError

SHARDED = "sharded"  # the DCP folder inside a checkpoint


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside Accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _options(frozen_from_files: bool) -> Any:
    """DCP's view of the model: without the frozen weights a fresh build reloads from files
    (a LoRA base), so a checkpoint holds what training changes, as a whole one does."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=frozen_from_files, strict=not frozen_from_files)


@contextlib.contextmanager
def one_process_quiet() -> Iterator[None]:
    """DCP warns that it assumes one process when no process group exists: that is what a
    single-process run of a sharded checkpoint means (the run says so itself)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def save_sharded(
    folder: Path, model: nn.Module, optimizer: Any, frozen_from_files: bool = False
) -> None:
    """Model and optimizer state into `folder/sharded`; every process calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if hasattr(optimizer, "engine"):  # DeepSpeed: the engine's own partitioned checkpoint
        from stackwise.io.deepspeed_files import save_engine

        return save_engine(folder, optimizer, frozen_from_files)
    options = _options(frozen_from_files)
    model_state, optim_state = get_state_dict(model, _inner(optimizer), options=options)
    with one_process_quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / SHARDED))


def load_sharded(
    folder: Path, model: nn.Module, optimizer: Any, frozen_from_files: bool = False
) -> None:
    """What save_sharded wrote, into this run's model and optimizer, however many processes
    wrote it and however many read it; every process calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from stackwise.io.deepspeed_files import is_engine_checkpoint, load_engine

    if is_engine_checkpoint(folder) or hasattr(optimizer, "engine"):
        if not (is_engine_checkpoint(folder) and hasattr(optimizer, "engine")):
            raise StackWiseError(
                f"Checkpoint '{folder}' was written by "
                f"{'a DeepSpeed' if is_engine_checkpoint(folder) else 'an FSDP'} run, and this "
                "run places its model another way; each reads only its own partitions. "
                "Resume with the parallel.strategy that wrote it, or start afresh."
            )
        return load_engine(folder, optimizer, frozen_from_files)
    inner, options = _inner(optimizer), _options(frozen_from_files)
    model_state, optim_state = get_state_dict(model, inner, options=options)
    state = {"model": model_state, "optim": optim_state}
    with one_process_quiet():
        dcp.load(state, checkpoint_id=str(folder / SHARDED))
    set_state_dict(
        model,
        inner,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )


def is_sharded(folder: Path) -> bool:
    """The checkpoint `folder` holds DCP shards (or DeepSpeed's partitions)."""
    from stackwise.io.deepspeed_files import is_engine_checkpoint

    return (folder / SHARDED).is_dir() or is_engine_checkpoint(folder)


def is_sharded_model(model: nn.Module) -> bool:
    """The model is FSDP2-sharded or ZeRO-3-partitioned: each forward gathers parameters
    from every rank."""
    from torch.distributed.fsdp import FSDPModule

    from stackwise.io.deepspeed_files import partitioned

    model = getattr(model, "_orig_mod", model)
    return isinstance(model, FSDPModule) or partitioned(getattr(model, "module", model))


def whole_model(model: nn.Module, build: Callable[[], nn.Module], main: bool) -> nn.Module:
    """A sharded `model`'s whole copy on the main process (`build()` makes an unsharded one,
    the gathered weights go into it); other processes keep `model`. Every process calls it
    (gathering is collective); an unsharded model is returned as it is."""
    if not is_sharded_model(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from stackwise.io.deepspeed_files import gathered_state, partitioned

    if partitioned(model):  # ZeRO-3
        state = gathered_state(model, main)
    else:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)  # whole on rank 0 alone
    if not main:
        return model
    whole = build()
    whole.load_state_dict(state)
    return whole


def gather_into(trained: nn.Module, whole: nn.Module) -> None:
    """The weights `trained` trains (its parameters that take gradients), sharded or not,
    copied whole into `whole`: a module of the same layout, such as the plain rack a stage's
    sharded copy was made from. Frozen weights are equal in both already, and a 4-bit one
    would lose its statistics on the way. One parameter at a time, each gathered on its
    mesh's device (an offloaded shard lives on the CPU). Every process calls it: each sharded
    tensor is gathered from all of them, in the same order."""
    from torch.distributed.tensor import DTensor

    for name, p in trained.named_parameters():
        if not p.requires_grad:
            continue
        if isinstance(p, DTensor):
            value = p.detach().to(p.device_mesh.device_type).full_tensor()
        else:
            value = p.detach()
        with torch.no_grad():
            whole.get_parameter(name).copy_(value)
