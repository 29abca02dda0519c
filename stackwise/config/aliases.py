"""The seeds' names applied to a config's plain data: each seed layout's key moved to the real
key it stands for (`training.max_length` -> `data.seq_len`, `qlora_rank` -> `lora.rank`), with
its value converted where the seed's type differs (`mixed_precision: true` -> `auto`), and the
seeds' value names renamed in place (`new_stack_precision: half` -> `fp16`).

Giving a key twice (an alias and its real key, or two aliases of one key) is refused, as is a
key under `training:` or `qlora:` that no seed names. The tables live in `seed_layouts`;
`stackwise config show --aliases` prints them.
"""

from __future__ import annotations

import copy
import difflib
import re
from typing import Any

from stackwise.config.paths import put, section_at
from stackwise.config.seed_layouts import (
    Layout,
    SeedKey,
    enhanced,
    infrastructure,
    model_trainer,
    progressive,
    unified,
)
from stackwise.errors import StackWiseError

LAYOUTS: tuple[Layout, ...] = tuple(
    m.LAYOUT for m in (unified, infrastructure, enhanced, progressive, model_trainer)
)

# names earlier releases accepted inside progressive: and train: as well as at the top
_NESTED_LEGACY = (
    "quantization_enabled", "quantization_type", "backbone_quantized", "adapters_full_precision",
    "mixed_precision", "new_stack_precision", "qlora_enabled", "use_lora", "qlora_rank",
    "lora_r", "qlora_alpha", "lora_alpha", "lora_dropout", "qlora_strategy",
    "qlora_rank_pattern", "qlora_alpha_pattern", "qlora_configs", "progressive_qlora",
    "progressive_qlora_rank", "progressive_qlora_alpha", "lora_lr", "memory_lr",
    "base_model_lr", "enabled_extensions", "eval_steps", "log_to_wandb",
)  # fmt: skip
# keys of ours that moved: the old name still loads, into the new key
RENAMED = {
    "progressive.growth_operator": "progressive.growth.init",
    "train.parallelizer": "parallel.strategy",
    "train.fsdp_sharding_strategy": "parallel.sharding",
}
# containers only the seeds write: emptied by the aliases, anything left in them is unknown
SEED_SECTIONS = ("training.progressive", "training", "qlora")


def _seed_keys() -> dict[str, SeedKey]:
    found: dict[str, SeedKey] = {}
    for layout in LAYOUTS:
        for path, key in layout.keys.items():
            if path in found and found[path].target != key.target:
                raise AssertionError(f"seed key {path} means two things")
            found.setdefault(path, key)
    for name in _NESTED_LEGACY:  # the same key as the seeds spell it, flat or in a section
        spelled = (name, f"training.progressive.{name}", f"training.{name}")
        key = next((found[p] for p in spelled if p in found), None)
        assert key is not None, f"legacy name {name} has no seed key"
        for where in ("", "progressive.", "train."):
            found.setdefault(where + name, key)
    for old, new in RENAMED.items():
        found.setdefault(old, SeedKey(new, note="its earlier name"))
    return {p: k for p, k in found.items() if p != k.target}  # a real key is no alias


SEED_KEYS: dict[str, SeedKey] = _seed_keys()
# alias path -> real path
KEY_ALIASES: dict[str, str] = {path: key.target for path, key in SEED_KEYS.items()}
# real path -> {seed value: real value}
VALUE_ALIASES: dict[str, dict[str, str]] = {}
for _layout in LAYOUTS:
    for _path, _values in _layout.values.items():
        VALUE_ALIASES.setdefault(_path, {}).update(_values)


def alias_table() -> list[tuple[str, str]]:
    """(alias, meaning) rows, keys first, for `stackwise config show --aliases`."""
    rows = []
    for path, key in sorted(SEED_KEYS.items()):
        note = f"  ({key.note})" if key.note else ""
        rows.append((path, key.target + note))
    for path, values in VALUE_ALIASES.items():
        rows += [(f"{path}: {old}", f"{path}: {new}") for old, new in values.items()]
    return rows


def convert_seed_value(path: str, value: Any) -> Any:
    """`value` given under the seed's `path`, as its real key takes it (OMIT: set nothing)."""
    key = SEED_KEYS[path]
    return key.convert(value) if key.convert is not None else value


def apply_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (never modified) with every seed key at its real key and every seed value
    renamed. Deeper paths go first, so `training.progressive.*` leaves `training.*` alone."""
    data = copy.deepcopy(data)
    moved: dict[str, str] = {}  # real path -> the seed path that set it
    given: dict[str, Any] = {}
    for path in sorted(SEED_KEYS, key=lambda p: -p.count(".")):
        *where, name = path.split(".")
        holder = section_at(data, where, create=False)
        if holder is None or name not in holder:
            continue
        given[path] = holder.pop(name)
        value = convert_seed_value(path, given[path])
        if value is model_trainer.OMIT:
            continue
        target = SEED_KEYS[path].target
        _refuse_twice(data, path, target, moved)
        put(data, target, value, f"'{path}'")
        moved[target] = path
    if model_trainer.both_precisions_off(given) and "train.mixed_precision" not in moved:
        _refuse_twice(data, "fp16/bf16", "train.mixed_precision", moved)
        put(data, "train.mixed_precision", "no")
    apply_implied(given, data)
    _refuse_leftovers(data)
    for path, values in VALUE_ALIASES.items():
        *sections, leaf = path.split(".")
        node = section_at(data, sections, create=False)
        if node is not None and isinstance(node.get(leaf), str) and node[leaf] in values:
            node[leaf] = values[node[leaf]]
    return data


def seed_spellings(data: dict[str, Any]) -> dict[str, str]:
    """real key -> the seed path `data` wrote it as, for each seed key present whose name
    differs from ours (`train.eval_every` -> `training.eval_steps`): errors name both."""
    found: dict[str, str] = {}
    for path, key in SEED_KEYS.items():
        *where, name = path.split(".")
        holder = section_at(data, where, create=False)
        if holder is not None and name in holder and name != key.target.rsplit(".", 1)[-1]:
            found.setdefault(key.target, path)
    return found


def _names(message: str, key: str) -> bool:
    """Whether `message` names `key` whole: not inside a longer key (`lora.rank` in
    `lora.rank_pattern`), though a sentence's full stop may follow it."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w)", message) is not None


def in_seed_names(message: str, spellings: dict[str, str]) -> str:
    """`message` with the spelling (a seed key, a flag) of each real key it names that the
    config was given under another name, before its closing advice. A key counts when named
    whole (`lora.rank`, not inside `lora.rank_pattern`) or, for a multi-word leaf such as
    eval_every, by its leaf."""
    said = []
    for real, spelled in spellings.items():
        leaf, own = real.rsplit(".", 1)[-1], spelled.lstrip("-")
        own_leaf = own.rsplit(".", 1)[-1]
        named = _names(message, real) or ("_" in leaf and _names(message, leaf))
        shown = _names(message, own) or ("_" in own_leaf and _names(message, own_leaf))
        if named and not shown:
            said.append(f"{real} is '{spelled}'")
    if not said:
        return message
    note = f"As the config wrote them: {'; '.join(said)}."
    tail = " Fix the value and rerun."
    if message.endswith(tail):
        return f"{message.removesuffix(tail)} {note}{tail}"
    return f"{message} {note}"


def apply_implied(given: dict[str, Any], data: dict[str, Any]) -> None:
    """What the seeds' keys `given` (seed path -> value as written) mean beyond their own key
    (a `training.progressive:` section means progressive growth), set where `data` is silent."""
    for layout in LAYOUTS:
        if layout.implied is not None and any(p in layout.keys for p in given):
            layout.implied({p: v for p, v in given.items() if p in layout.keys}, data)


def _refuse_twice(data: dict[str, Any], path: str, target: str, moved: dict[str, str]) -> None:
    *sections, leaf = target.split(".")
    node = section_at(data, sections, create=False)
    if target in moved:
        raise StackWiseError(
            f"Config sets {target} twice, as '{moved[target]}' and as '{path}' (two names of "
            "one key); keep one of them."
        )
    if node is not None and leaf in node:
        raise StackWiseError(
            f"Config sets both '{path}' and '{target}' (its documented alias); keep one of them."
        )


def _refuse_leftovers(data: dict[str, Any]) -> None:
    """Drop the seed-only containers the aliases emptied; name any key still in one."""
    for container in SEED_SECTIONS:
        *where, name = container.split(".")
        holder = section_at(data, where, create=False)
        if holder is None or name not in holder:
            continue
        node = holder[name]
        if isinstance(node, dict) and not node:
            del holder[name]
            continue
        if not isinstance(node, dict):
            raise StackWiseError(f"'{container}' must be a section of keys, not {node!r}.")
        known = sorted(
            p.removeprefix(container + ".")
            for p in SEED_KEYS
            if p.startswith(container + ".") and "." not in p[len(container) + 1 :]
        )
        stray = [k for k in node if not (container == "training" and k == "progressive")]
        if not stray:
            continue
        hints = []
        for key in stray:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hints.append(
                f"'{container}.{key}'" + (f" (did you mean '{close[0]}'?)" if close else "")
            )
        raise StackWiseError(
            f"Unknown key{'s' if len(hints) > 1 else ''} {', '.join(hints)} in the seeds' "
            f"'{container}:' section. It takes: {', '.join(known)}; `stackwise config show "
            "--aliases` lists every seed key and where it lands."
        )
