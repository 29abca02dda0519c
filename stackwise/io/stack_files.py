"""Saving grown racks stack by stack, and rebuilding a rack from those files alone.

Layout under the run dir:
  stacks/stack_<g>.safetensors   the blocks of the stack grown g-th (its own key names)
  stacks/stack_<g>.json          its shape, precision, rack position and noise range
  stacks/anchor.safetensors      embeddings, time embedding, final norm, untied head
  stacks/manifest.json           the rack order (growth indices, embeddings to head)
Files are written to a temporary name and renamed, so a crash never leaves half a stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stackwise.errors import StackWiseError
from stackwise.io.files import read_json, read_tensors, save_tensors, write_json
from stackwise.model.layers import Stack
from stackwise.model.rack import Rack
from stackwise.precision import HALF_FLOATS, QUANT_FORMATS, torch_dtype
from stackwise.spec import Plan

STACKS_DIR = "stacks"
MANIFEST = "manifest.json"
ANCHOR = "anchor.safetensors"
HISTORY = "progressive_history.json"  # finished stages of a progressive run, for resume


RETRAIN = "The saved stacks are incomplete or damaged: restore them, or retrain."


def anchor_state(rack: Rack) -> dict[str, torch.Tensor]:
    return {k: v for k, v in rack.state_dict().items() if not k.startswith("stacks.")}


def save_stack(folder: Path, growth_index: int, stack: Stack, info: dict[str, Any]) -> Path:
    folder = folder / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"stack_{growth_index}.safetensors"
    save_tensors(stack.state_dict(), path)
    meta = {"growth_index": growth_index, "n_blocks": len(stack.blocks), **info}
    write_json(folder / f"stack_{growth_index}.json", meta)
    return path


def save_anchor_and_manifest(folder: Path, rack: Rack, order: list[int]) -> None:
    """`order[i]` is the growth index of the stack at rack position i."""
    folder = folder / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors(anchor_state(rack), folder / ANCHOR)
    write_json(folder / MANIFEST, {"order": order})


def _load(path: Path) -> dict[str, torch.Tensor]:
    return read_tensors(path, RETRAIN)


def read_manifest(folder: Path) -> list[dict[str, Any]] | None:
    """Per rack position, the saved stack's metadata; None when there is no stacks/ dir."""
    root = folder / STACKS_DIR
    manifest = root / MANIFEST
    if not manifest.is_file():
        return None
    order = read_json(manifest, RETRAIN)["order"]
    return [read_json(root / f"stack_{g}.json", RETRAIN) for g in order]


def needs_structure(metas: list[dict[str, Any]] | None) -> bool:
    """True when some stack is stored quantized, in another dtype, or carries adapters."""
    return bool(metas) and any(
        m.get("storage", "full") != "full" or m.get("adapters") for m in metas or []
    )


def restructure_stack(stack: Stack, meta: dict[str, Any]) -> Stack:
    """Give a fresh stack the storage and adapters recorded in its metadata."""
    from stackwise.quant.layers import quantize_linears
    from stackwise.quant.lora import adapter_from_record, add_adapter

    storage = meta.get("storage", "full")
    if storage in HALF_FLOATS:
        stack.to(torch_dtype(storage))
    elif storage in QUANT_FORMATS:
        quantize_linears(stack, storage)
    for name, record in sorted(meta.get("adapters", {}).items()):
        add_adapter(stack, name, adapter_from_record(record))
    return stack


def rack_from_stacks(
    plan: Plan, vocab_size: int, folder: Path, weights: Path | None = None
) -> Rack:
    """Rebuild the rack of `plan` (its model, objective, masking and memory) from stacks/:
    anchor, then each stack at its position with its storage and adapters. With `weights` (a
    full model.safetensors) those weights are loaded instead."""
    from stackwise.quant.layers import load_quantized_state

    root = folder / STACKS_DIR
    metas = read_manifest(folder)
    if metas is None:
        raise StackWiseError(
            f"'{folder}' has neither model.safetensors nor {STACKS_DIR}/{MANIFEST}. Pass a "
            "folder written by `stackwise train`."
        )
    causal = plan.objective.causal
    rack = Rack(plan.model, vocab_size, causal, plan.masking.num_time_steps, n_stacks=0)
    for meta in metas:
        stack = Stack(plan.model, causal, meta["n_blocks"], meta["growth_index"])
        rack.stacks.append(restructure_stack(stack, meta))
    if plan.memory_on:  # the memory layers sit in the stacks' blocks, and in their files
        from stackwise.model.memory import attach_memory

        attach_memory(rack, plan.memory)
    try:
        if weights is not None:
            load_quantized_state(rack, _load(weights))
            return rack
        _strict_load_partial(rack, _load(root / ANCHOR), root / ANCHOR)
        for meta, stack in zip(metas, rack.stacks, strict=True):
            path = root / f"stack_{meta['growth_index']}.safetensors"
            load_quantized_state(stack, _load(path))
    except (KeyError, RuntimeError) as err:
        raise StackWiseError(
            f"The saved weights in '{folder}' do not match the model built from its config "
            f"and stack files ({str(err)[:200]}). Use the config saved with them."
        ) from None
    return rack


def _strict_load_partial(rack: Rack, state: dict[str, torch.Tensor], path: Path) -> None:
    own = anchor_state(rack)
    if set(own) != set(state) or any(own[k].shape != state[k].shape for k in own):
        raise StackWiseError(
            f"'{path}' does not match the model built from config.yaml. Use the config saved "
            "with these stacks."
        )
    rack.load_state_dict(state, strict=False)
