"""What a run prints about itself: its first line (model, data, device, precision, where it
saves) and its last evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from stackwise.data.pack import PreparedData
from stackwise.io.stack_files import save_anchor_and_manifest, save_stack
from stackwise.model.rack import count_parameters
from stackwise.train.hardware import describe_precision


def data_line(data: PreparedData, config: Any) -> str:
    """What the run trains on, for its first line."""
    return data.describe or (
        f"{len(data.train):,} train / {len(data.val):,} val sequences of "
        f"{config.data.seq_len} tokens"
    )


def routed(config: Any) -> str:
    """The rack's routed layers, for the header: experts, memory chapters."""
    out, moe, mem = "", config.model.moe, config.memory
    if moe.num_experts:
        out += f", {moe.num_experts} experts (top-{moe.top_k})"
    if config.memory_on:
        where = ", ".join(str(i % config.model.n_layers) for i in mem.layers)
        out += (
            f", memory after block(s) {where} ({mem.chapters} chapters x "
            f"{mem.slots_per_chapter} slots, top-{mem.top_k})"
        )
    return out


def header(
    config: Any,
    data: PreparedData,
    adapter: Any,
    model: nn.Module,
    trainer: Any,
    note: str,
) -> str:
    """The run's first line: model, data, device, precision, where it saves."""
    what = adapter.describe(model, config) or (
        f"{config.objective.name} {adapter.name}, {count_parameters(model):,} parameters, "
        f"{config.model.n_stacks}x{config.model.blocks_per_stack} blocks{note}{routed(config)}"
    )
    rows = data_line(data, config)
    return (
        f"StackWise: {what}; {rows}; device {trainer.accelerator.device}"
        f"{placement(config, trainer.accelerator)}, precision "
        f"{precision(config, trainer)}; output {trainer.output_dir}" + saving_note(config)
    )


def placement(config: Any, accelerator: Any) -> str:
    """How several processes share the model: whole copies (DDP) or FSDP2 shards (one GPU's
    model too, when it offloads to the CPU)."""
    p, world = config.parallel, accelerator.num_processes
    if p.deepspeed is not None:
        stage = p.deepspeed["zero_optimization"]["stage"]
        where = f"over {world} processes" if world > 1 else "on one process"
        return f", partitioned by DeepSpeed ZeRO-{stage} {where}"
    if world == 1:
        offloads = p.shards and p.cpu_offload and accelerator.device.type != "cpu"
        return ", sharded by FSDP2 to offload to the CPU" if offloads else ""
    if p.shards:
        return f", sharded by FSDP2 ({p.sharding or 'full_shard'}) over {world} processes"
    return f" x {world} processes ({p.name})"


def final_eval_line(ev: dict[str, Any]) -> str:
    """The run's last evaluation in one line, bits per character included."""
    parts = [f"val loss {ev['loss']:.3f}"]
    if "nelbo" in ev:
        parts.append(f"NELBO {ev['nelbo']:.3f} nats/token")
    elif "ppl" in ev:
        parts.append(f"ppl {ev['ppl']:.2f}")
    if "bpc" in ev:
        parts.append(f"{ev['bpc']:.3f} bits per character")
    return f"final eval (step {ev.get('step', '?')}): " + ", ".join(parts)


def saving_note(config: Any) -> str:
    """What survives a crash, said before the run starts rather than after it is lost."""
    every = config.train.save_steps
    if every:
        return f"; a checkpoint every {every} steps"
    return (
        "; no periodic checkpoints (train.save_steps: 0): Ctrl-C or SIGTERM still saves one, "
        "a hard kill or power loss loses the run"
    )


def precision(config: Any, trainer: Any) -> str:
    said = describe_precision(config.train.mixed_precision, trainer.accelerator.device)
    placement = getattr(trainer, "placement", None)  # a growth recipe has none yet
    return said if placement is None else f"{said}, {placement.compiling.note}"


def save_all_stacks(rack: nn.Module, output_dir: Path) -> None:
    """End-to-end runs also write stacks/ (save_stacks), so any rack can be regrown from it."""
    from stackwise.quant.rack_qlora import stack_record  # quantization's modules: at the end

    stacks = getattr(rack, "stacks", None)
    if stacks is None:
        return  # another adapter's model has no stacks to save one by one
    for i, stack in enumerate(stacks):  # QLoRA (lora on an end-to-end rack): as stored
        save_stack(output_dir, i, stack, {"position": i, **stack_record(stack), "t_range": None})
    save_anchor_and_manifest(output_dir, rack, list(range(len(stacks))))  # type: ignore[arg-type]
