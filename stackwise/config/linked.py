"""Model keys the progressive section decides (mode/block_size -> blocks_per_stack,
target_stacks -> n_stacks): one rule, for loading and for attribute edits alike."""

from __future__ import annotations

from typing import Any


def linked_model_keys(progressive: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The model keys the progressive section decides, each with the key that decides it."""
    mode, size = progressive.get("mode", "blockwise"), progressive.get("block_size")
    wanted = {
        "blocks_per_stack": (1 if mode == "layerwise" else size, f"progressive.mode {mode}"),
        "n_stacks": (progressive.get("target_stacks"), "progressive.target_stacks"),
    }
    return {key: (want, source) for key, (want, source) in wanted.items() if want is not None}
