"""Growing on an imported trunk: `model.init_from_hf` with progressive growth.

The checkpoint's layers become the first stacks (blocks_per_stack layers each) with its
embeddings, final norm and head, all frozen as a trunk; growth then adds stacks up to
model.n_stacks, each trained on top of the imported ones (with the activation cache, the
imported trunk runs once per sample).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackwise.io.hf_llama import load_llama_weights, read_llama_config


def imported_stacks(config: Any) -> int:
    """How many stacks the checkpoint of model.init_from_hf fills."""
    folder = Path(config.model.init_from_hf).expanduser()
    layers = int(read_llama_config(folder)["num_hidden_layers"])
    return layers // config.model.blocks_per_stack


def import_trunk(pt: Any) -> None:
    """Grow the imported stacks into `pt`'s builder, load the checkpoint, freeze it all and
    save its stack files (so the run folder describes the whole rack).
    A resumed run imports the same way, then regrows its trained stacks after these."""
    b, folder = pt.builder, Path(pt.config.model.init_from_hf).expanduser()
    n = imported_stacks(pt.config)
    for _ in range(n):
        b.add_stack(precision="full")
    load_llama_weights(b.rack, folder)
    b.new_stack = None
    for stack in b.grown:
        b.set_trainable(stack, False)
    b.set_anchor_trainable(False)
    target = pt.config.model.n_stacks
    pt.log(f"imported {n} stack(s) from {folder} as the frozen trunk; growing to {target}")
    if pt.p.save_stacks and not pt.config.train.resume_from_checkpoint:
        pt.save_stacks(changed_only=False)
