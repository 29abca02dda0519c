"""A checkpoint's config.yaml against the running config, as plain data: what a resume may not
change (the model's shape, its experts and memory, the objective, a stream's data).

The saved file is read with yaml.safe_load, never validated again: a key it leaves out has the
default of its spec (what the run used before the key existed). The running side is a Plan's
`source` (or, until every caller passes a Plan, a config's dump).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.io.files import read_yaml
from stackwise.spec import DataSpec, MemorySpec, ModelSpec, MoESpec, ObjectiveSpec, TrainSpec
from stackwise.spec.model import RACK_SHAPE_FIELDS

RESUME_ELSEWHERE = "Resume from another checkpoint."

# fields that make the saved weights a different function: a resume that changes one is refused
SHAPE_FIELDS = RACK_SHAPE_FIELDS
MOE_FIELDS = ("num_experts", "top_k", "expert_hidden", "shared_expert", "stacks")
MEMORY_FIELDS = ("chapters", "slots_per_chapter", "top_k", "layers")
# where each compared section's defaults come from when a saved config.yaml leaves a key out
DEFAULTS: dict[str, Any] = {
    "model": ModelSpec(),
    "model.moe": MoESpec(),
    "memory": MemorySpec(),
    "data": DataSpec(),
    "objective": ObjectiveSpec(),
    "train": TrainSpec(),
}


def plain_config(config: Any) -> dict[str, Any]:
    """A run's config as plain data: a Plan's `source`, a config's dump (until every caller
    passes a Plan), or what a saved config.yaml holds."""
    if isinstance(config, dict):
        return config
    source = getattr(config, "source", None)
    return source if isinstance(source, dict) else config.model_dump(mode="json")


def value(data: dict[str, Any], section: str, name: str) -> Any:
    """`section.name` of plain config data; a key it leaves out has its default."""
    node: Any = data
    for part in section.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and name in node:
        return node[name]
    return _plain(getattr(DEFAULTS[section], name))


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def memory_on(data: dict[str, Any]) -> bool:
    """train.enabled_extensions lists memory (a hand-written file may use the seeds' flat
    name, enabled_extensions, at the top or under progressive)."""
    places = (data.get("train"), data, data.get("progressive"))
    named = [(p or {}).get("enabled_extensions") for p in places if isinstance(p, dict | None)]
    return any(isinstance(n, list) and "memory" in n for n in named)


def differences(
    section: str,
    saved: dict[str, Any],
    config: dict[str, Any],
    fields: Sequence[str],
    key: Callable[[dict[str, Any], str], object] | None = None,
) -> list[str]:
    """`section.field saved -> now` for each field that differs between the plain configs,
    compared by `key(config, field)` (default: the field's own value)."""

    def plain(c: dict[str, Any], f: str) -> object:
        return value(c, section, f)

    by = key or plain
    return [
        f"{section}.{f} {plain(saved, f)} -> {plain(config, f)}"
        for f in fields
        if by(saved, f) != by(config, f)
    ]


def _memory_value(config: dict[str, Any], name: str) -> object:
    """memory.<name>; a rack's layers as the blocks they name ([-1] is [3] of 4 blocks). A
    Hugging Face model's layer count is unknown here: its memory.safetensors, keyed by the
    layers' indices, refuses other layers when it loads."""
    got = value(config, "memory", name)
    if name == "layers":
        if value(config, "model", "source") != "rack":
            return None
        n = value(config, "model", "n_stacks") * value(config, "model", "blocks_per_stack")
        return sorted(i % n for i in got)
    return got


def read_saved(path: Path) -> dict[str, Any] | None:
    """The config.yaml a checkpoint was saved with, as plain data (None: it has none)."""
    saved_path = path / "config.yaml"
    if not saved_path.is_file():
        return None
    data = read_yaml(saved_path, RESUME_ELSEWHERE)
    if data is not None and not isinstance(data, dict):
        raise StackWiseError(
            f"'{saved_path}' holds a {type(data).__name__}, not a config. {RESUME_ELSEWHERE}"
        )
    return data or {}


def shape_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What makes the saved weights another function than the running config's model."""
    changed = differences("model", saved, now, SHAPE_FIELDS)
    changed += differences("model.moe", saved, now, MOE_FIELDS)  # the experts and their routing
    was, is_on = memory_on(saved), memory_on(now)
    if was != is_on:
        on = {True: "on", False: "off"}
        changed.append(f"memory layers {on[was]} -> {on[is_on]}")
    elif is_on:
        changed += differences("memory", saved, now, MEMORY_FIELDS, _memory_value)
    changed += differences("objective", saved, now, ("name",))
    return changed


# what a stream position counts in: another value makes the saved position point elsewhere
STREAM_FIELDS = (
    "streaming",
    "files",
    "dataset_dir",
    "dataset_name",
    "dataset_subset",
    "dataset_split",
    "format",
    "text_field",
    "tokenizer",
    "seq_len",
    "stream_val_blocks",
    "num_samples",
)


def check_stream(path: Path, saved: Any, config: Any) -> None:
    """A streamed run resumes only over the data it was reading: its position counts pieces,
    tokens and blocks of that data (a token store notices an edit itself; a stream cannot)."""
    saved, config = plain_config(saved), plain_config(config)
    if not (value(saved, "data", "streaming") or value(config, "data", "streaming")):
        return
    changed = differences("data", saved, config, STREAM_FIELDS)
    if changed:
        raise StackWiseError(
            f"The checkpoint '{path}' was reading its data as another stream "
            f"({'; '.join(changed)}), so its saved position would point elsewhere in this one. "
            "Resume with the data settings it was saved with (its config.yaml), or start a new "
            "run in another train.output_dir."
        )
