"""Config files: YAML (safe_load) or JSON, refusing a key set twice, a syntax error or an empty
file with a message that names the file as the user gave it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from stackwise.errors import StackWiseError


class DuplicateKey(ValueError):
    """A mapping that names one key twice (the parsers would keep the last silently)."""

    def __init__(self, key: Any, lines: tuple[int, int] | None = None) -> None:
        super().__init__(key)
        self.key, self.lines = key, lines


class UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key set twice in one mapping (merged `<<` keys may be
    overridden, as YAML means them to be)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else []:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise DuplicateKey(key, (seen[key], line))
                seen[key] = line
            except TypeError:  # an unhashable key: the base class names it
                continue
        return super().construct_mapping(node, deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def parse_config_text(text: str, path: Path, what: str) -> Any:
    """A config file's text as JSON (.json) or YAML; a syntax error or a key set twice is
    refused, naming `what` (the file as the user gave it)."""
    is_json = path.suffix.lower() == ".json"
    try:
        if is_json:
            return json.loads(text, object_pairs_hook=_unique_pairs)
        return yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKey as dup:
        where = f" (lines {dup.lines[0]} and {dup.lines[1]})" if dup.lines else " in one object"
        raise StackWiseError(
            f"{what} sets the key '{dup.key}' twice{where}; only one value can hold, and the "
            "parser would silently keep the last. Delete the one you do not mean."
        ) from None
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        where = str(err).replace("\n", " ")
        raise StackWiseError(
            f"{what} is not valid {'JSON' if is_json else 'YAML'}: {where}. Fix the syntax and "
            "rerun."
        ) from None


def read_file(path: str | Path, what: str | None = None) -> Any:
    """A config file's content; `what` names it in errors as the user gave it (`--config x`)."""
    path = Path(path).expanduser()
    what = what or f"Config file '{path}'"
    if not path.is_file():
        found = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise StackWiseError(f"{what} {found}. Give a YAML or JSON file.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise StackWiseError(f"Cannot read {what}: {err}.") from None
    data = parse_config_text(text, path, what)
    if data is None:
        raise StackWiseError(
            f"{what} is empty (no settings), so the run would silently use the defaults. Put "
            "your settings in it, or name a preset instead (e.g. tiny-clm)."
        )
    return data
