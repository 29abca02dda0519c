"""A config written back in a seed's layout (`stackwise config show --as-seed 001`): every key
the seed names under the seed's own path, the rest in our sections, so that loading the result
gives the same config again."""

from __future__ import annotations

from typing import Any

import yaml

from stackwise.config.aliases import LAYOUTS
from stackwise.config.paths import put, section_at
from stackwise.config.root import Config
from stackwise.config.seed_layouts import NOT_SEED, Layout, seed_value
from stackwise.errors import StackWiseError

SEEDS = {layout.seed: layout for layout in LAYOUTS}


def layout_of(seed: str) -> Layout:
    name = seed.removeprefix("seed").strip("_ -").zfill(3)
    if name not in SEEDS:
        raise StackWiseError(
            f"No seed layout '{seed}'; the seeds' layouts are {', '.join(sorted(SEEDS))} "
            "(e.g. `stackwise config show FILE --as-seed 001`)."
        )
    return SEEDS[name]


def _take(data: dict[str, Any], path: str) -> tuple[bool, Any]:
    *sections, leaf = path.split(".")
    node = section_at(data, sections, create=False)
    if node is None or leaf not in node:
        return False, None
    return True, node.pop(leaf)


def as_seed(config: Config, seed: str) -> dict[str, Any]:
    """`config` as plain data in seed `seed`'s layout. Keys the seed does not name (and values
    its keys cannot spell) stay in our sections; our sections keep only what differs from the
    defaults, so the seed's keys lead."""
    layout = layout_of(seed)
    ours = config.model_dump(mode="json")
    defaults = Config().model_dump(mode="json")
    out: dict[str, Any] = {}
    for path, key in layout.keys.items():
        *sections, leaf = key.target.split(".")
        node = section_at(ours, sections, create=False)
        if node is None or leaf not in node:
            continue  # taken by an earlier name of the same key
        value = seed_value(key, node[leaf])
        if value is NOT_SEED:
            continue
        del node[leaf]
        put(out, path, value)
    for name, section in ours.items():
        changed = _changed(section, defaults.get(name))
        if changed:
            out.setdefault(name, {}).update(changed)
    if layout.implied is not None:
        _pin_implied(out, config)
    return out


def _pin_implied(out: dict[str, Any], config: Config) -> None:
    """Keys the seed's keys imply when read back (a cache_mode turns the cache on) but that
    `config` sets otherwise, written out as our keys so the layout loads as the same config."""
    from stackwise.config.aliases import apply_aliases

    try:
        back = apply_aliases(out)
    except StackWiseError:
        return
    ours = config.model_dump(mode="json")
    for path in _leaf_paths(back):
        *sections, leaf = path.split(".")
        node = section_at(ours, sections, create=False)
        theirs = section_at(back, sections, create=False)
        if node is not None and theirs is not None and node.get(leaf) != theirs.get(leaf):
            put(out, path, node.get(leaf))


def _leaf_paths(data: dict[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            paths += _leaf_paths(value, f"{prefix}{key}.")
        else:
            paths.append(f"{prefix}{key}")
    return paths


def _changed(section: Any, default: Any) -> Any:
    """What of `section` differs from `default` (nested sections compared key by key)."""
    if not isinstance(section, dict) or not isinstance(default, dict):
        return section if section != default else None
    diff = {}
    for key, value in section.items():
        if key not in default:
            diff[key] = value
            continue
        sub = _changed(value, default[key])
        if sub is not None and sub != {}:
            diff[key] = (
                sub
                if isinstance(value, dict)
                and isinstance(default[key], dict)
                and (set(value) == set(default[key]))
                else value
            )
    return diff


def seed_yaml(config: Config, seed: str) -> str:
    layout = layout_of(seed)
    head = f"# seed {layout.seed} layout ({layout.title}); loads with `stackwise train FILE`\n"
    return head + yaml.safe_dump(as_seed(config, seed), sort_keys=False)
