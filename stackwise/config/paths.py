"""The one dotted-path setter: `train.lr`, `progressive.stacks.0.steps` or a seed's flat name
(through the alias table) set in a config's plain data. Overrides, aliases, derived configs and
`stackwise finetune`'s flags all write through it."""

from __future__ import annotations

from typing import Any

from stackwise.errors import StackWiseError


def key_in(node: dict[str, Any], part: str) -> Any:
    """`part`, or the integer key it spells when `node` has one (`progressive.stacks.0`)."""
    return int(part) if part.isdigit() and part not in node and int(part) in node else part


def section_at(
    data: dict[str, Any], parts: list[str], create: bool = True, where: str = ""
) -> dict[str, Any] | None:
    """The mapping at `parts` in `data` (made on the way when `create`, else None when
    missing). A value where a section should be is refused, naming `where` it was asked."""
    node = data
    for part in parts:
        key = key_in(node, part)
        child = node.get(key)
        if child is None:
            if not create:
                return None
            child = node[key] = {}
        if not isinstance(child, dict):
            if not create:
                return None
            raise StackWiseError(f"{where or 'A config path'}: '{part}' is a value, not a section.")
        node = child
    return node


def put(
    data: dict[str, Any], path: str, value: Any, where: str = "", clash: str | None = None
) -> None:
    """data[path] = value for a dotted `path`. With `clash` (where the value comes from), a
    value already there is refused rather than silently replaced."""
    *sections, leaf = path.split(".")
    node = section_at(data, sections, create=True, where=where or path)
    assert node is not None
    key = key_in(node, leaf)
    if clash is not None and key in node:
        raise StackWiseError(
            f"{clash} sets {path} twice (a flat name and its section key); keep one."
        )
    node[key] = value
