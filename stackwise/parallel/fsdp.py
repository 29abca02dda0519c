"""`fsdp`: FSDP2 (torch.distributed.fsdp.fully_shard) on the model directly.

Every transformer block (a rack's `Block`, a Hugging Face model's `_no_split_modules` layers)
becomes its own shard unit, then the whole model: each process holds 1/N of every parameter,
gradient and optimizer state, and gathers one block's parameters just before it runs. The same
code runs on CPUs (gloo) and GPUs (NCCL). Accelerate only launches the processes; it never sees
the model, so it cannot quietly fall back to DDP.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.model.layers import Attention, Block
from stackwise.precision import torch_dtype
from stackwise.quant.layers import place_quant_states
from stackwise.registry import register_parallelizer
from stackwise.train.autocast import autocast_forward
from stackwise.train.hardware import release_at_exit

RESHARD_AFTER_FORWARD = {
    "full_shard": True,
    "shard_grad_op": False,
    "hybrid_shard": True,
    "no_shard": False,
}


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one, innermost first: the rack's blocks, or the layers a
    Hugging Face model names in `_no_split_modules` (its decoder layers). Blocks the model
    may run on one process alone (`rank_local_modules`: a progressive stage's cached trunk)
    stay with the root's parameters: a block's own gather would wait for peers that never
    run it."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    local = getattr(model, "rank_local_modules", list)()
    alone = {id(m) for part in local for m in part.modules()}
    return [
        m
        for m in model.modules()
        if (isinstance(m, Block) or type(m).__name__ in names) and id(m) not in alone
    ]


def device_mesh(sharding: str, world: int, group_size: int | None, device: torch.device) -> Any:
    """A 1-D mesh over every process, or for hybrid_shard/no_shard a 2-D (replicate, shard)
    mesh: shard groups of `group_size` processes (hybrid; default one node's), size 1 (none)."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = device.type
    if sharding == "full_shard" or sharding == "shard_grad_op":
        return init_device_mesh(kind, (world,))
    size = (
        1
        if sharding == "no_shard"
        else group_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    )
    if world % size:
        raise StackWiseError(
            f"parallel.shard_group_size {size} does not divide the {world} processes of this "
            "run: hybrid_shard shards within groups of that size and replicates across them. "
            f"Pick a divisor of {world} (the processes of one node, usually)."
        )
    return init_device_mesh(kind, (world // size, size), mesh_dim_names=("replicate", "shard"))


def mixed_precision(spec: Any, autocast: str) -> Any:
    """FSDP2's precision policy: parameters gathered in param_dtype (auto: the run's autocast
    dtype, else fp32), gradients reduced in reduce_dtype (auto: param_dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param = spec.param_dtype if spec.param_dtype != "auto" else autocast  # autocast "no": fp32
    reduce = spec.reduce_dtype if spec.reduce_dtype != "auto" else param
    return MixedPrecisionPolicy(param_dtype=_dtype(param), reduce_dtype=_dtype(reduce))


def _dtype(name: str) -> torch.dtype | None:
    """A precision's dtype; None (FSDP: keep the parameters' own) for no autocast."""
    return None if name == "no" else torch_dtype(name)


def one_process_group(device: torch.device) -> None:
    """A process group of this process alone (FSDP2 shards over a group), where no launcher
    made one; released with the others at the run's end (train.hardware.release_processes)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        release_at_exit()


def note_unsplit_dtypes(spec: Any) -> None:
    """Say which dtype settings a one-process run (nothing to shard) does not use."""
    defaults = {"param_dtype": "auto", "reduce_dtype": "fp32"}
    unused = [
        f"parallel.{k}: {getattr(spec, k)}"
        for k, default in defaults.items()
        if getattr(spec, k) != default
    ]
    if unused:
        print(
            f"stackwise: note: {', '.join(unused)} changes nothing here: one process has "
            "nothing to shard, so its model trains whole (as set by train.mixed_precision).",
            file=sys.stderr,
        )


@register_parallelizer("fsdp", wraps_model=True, shards=True)
class FSDP:
    """Shards the model with fully_shard before its optimizer is made (the optimizer must see
    the sharded parameters); gradients are reduce-scattered during backward."""

    def __init__(self) -> None:
        self.spec: Any = None

    def configure(self, spec: Any) -> None:
        """The plan's ParallelSpec: sharding, shard group, dtypes, offload."""
        self.spec = spec

    def shard(self, model: nn.Module, accelerator: Any) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        spec = self.spec
        sharding = spec.sharding or "full_shard"  # the plan resolves it; a spec made by hand
        device = accelerator.device
        offload = spec.cpu_offload and device.type != "cpu"
        if spec.cpu_offload and not offload and accelerator.is_main_process:
            print(
                "stackwise: note: parallel.cpu_offload keeps the shards on the CPU, where this "
                "run already trains: it changes nothing here.",
                file=sys.stderr,
            )
        if accelerator.num_processes == 1:
            if not offload:  # nothing to split; checkpoints stay DCP's
                if accelerator.is_main_process:
                    note_unsplit_dtypes(spec)
                return model.to(device)
            one_process_group(device)  # offloading one GPU's model needs FSDP's machinery
        mesh = device_mesh(sharding, accelerator.num_processes, spec.shard_group_size, device)
        options = {
            "mesh": mesh,
            "reshard_after_forward": RESHARD_AFTER_FORWARD[sharding],
            "mp_policy": mixed_precision(spec, accelerator.mixed_precision),
            "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
        }
        if device.type != "cpu":  # 4-bit statistics are not parameters: FSDP leaves them
            place_quant_states(model, device)
        for module in model.modules():  # no whole copies of gathered q and k weights
            if isinstance(module, Attention):
                module.rope_pairing = False
        # each unit moves to the device as it is sharded: one unit whole there at a time
        for unit in shard_units(model):
            fully_shard(unit, **options)
        fully_shard(model, **{**options, "reshard_after_forward": False})
        return model

    def place(self, model: nn.Module, optimizer: Any, accelerator: Any) -> tuple[Any, Any]:
        """The model is already sharded (`shard`); Accelerate only wraps the optimizer. Its
        forward autocasts in train.mixed_precision, outputs in fp32, as DDP's does."""
        if accelerator.mixed_precision != "no":
            autocast_forward(model, accelerator)
        return model, accelerator.prepare(optimizer)

    def sync_gradients(self, raw_model: nn.Module, accelerator: Any) -> None:
        """Nothing to do: backward reduce-scattered them into each process's shard."""
