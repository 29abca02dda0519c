"""Loading configs: a file and its dotted overrides through the aliases, the key check and
validation, into one Config, with errors that name the key and the fix.

Reading files is `files`, overrides `overrides`, unknown keys `keys`; their public names are
importable from here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stackwise.config.aliases import KEY_ALIASES, apply_aliases, in_seed_names, seed_spellings
from stackwise.config.base import ALL_RULES, QUOTE_HINT
from stackwise.config.files import parse_config_text, read_file
from stackwise.config.keys import check_keys
from stackwise.config.keys import nearest as _nearest  # noqa: F401 (the cli's flag hints)
from stackwise.config.overrides import apply_overrides, parse_override
from stackwise.config.root import Config
from stackwise.errors import StackWiseError

__all__ = [
    "InvalidConfig",
    "apply_overrides",
    "format_validation",
    "from_dict",
    "invalid_config",
    "load_config",
    "parse_config_text",
    "parse_override",
    "read_file",
    "save_config",
    "validated",
]


class InvalidConfig(StackWiseError):
    """A config that fails validation; `problems` lists each one (with its key where known)."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


def _problems(err: ValidationError) -> tuple[list[str], list[str]]:
    """(the message's parts, every single problem): a rules' report is one part of many."""
    parts, problems = [], []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) else f" (got {given!r})"
        if isinstance(given, bool):
            shown += f" ({QUOTE_HINT})"
        parts.append(f"{loc}: {msg}{shown}" if loc else f"{msg}{shown}")
        found = getattr(e.get("ctx", {}).get("error"), "problems", None)
        prefix = f"{loc}: " if loc else ""
        problems += [prefix + p for p in found] if found else [parts[-1]]
    return parts, problems


def format_validation(err: ValidationError, origin: str) -> str:
    return invalid_config(err, origin).args[0]


def invalid_config(err: ValidationError, origin: str) -> InvalidConfig:
    parts, problems = (list(dict.fromkeys(x)) for x in _problems(err))  # rules may agree
    where = "" if origin == "config" else f" in {origin}"
    message = f"Invalid config{where}: " + "; ".join(parts) + ". Fix the value and rerun."
    return InvalidConfig(message, problems)


def validated(data: dict[str, Any], origin: str) -> Config:
    """`data` as a Config, with every rule's problem in one message. A value of the wrong type
    stops the rules across sections (they need typed values); the sections that parse then
    check themselves, so their problems still come with the type errors."""
    try:
        return Config.model_validate(data, context=ALL_RULES)
    except ValidationError as err:
        if all(not e["loc"] for e in err.errors()):  # the rules' own report
            raise invalid_config(err, origin) from None
    try:
        Config.model_validate(data)
    except ValidationError as err:
        raise invalid_config(err, origin) from None
    raise AssertionError("a config failed once and then passed")  # validation is pure


def from_dict(data: Any, origin: str = "config", spellings: dict[str, str] | None = None) -> Config:
    """`data` validated; `spellings` (real key -> seed path) of data aliased before, so that
    an error names a key as the file wrote it too."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise StackWiseError(
            f"{origin} must be a mapping of sections (model:, data:, train: ...), "
            f"but it holds a {type(data).__name__}."
        )
    spellings = {**seed_spellings(data), **(spellings or {})}
    data = apply_aliases(data)
    check_keys(data, Config)
    try:
        return validated(data, origin)
    except InvalidConfig as err:
        if not spellings:
            raise
        raise InvalidConfig(in_seed_names(err.args[0], spellings), err.problems) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data = read_file(path) if path is not None else {}
    spellings: dict[str, str] = {}
    if isinstance(data, dict):
        spellings = seed_spellings(data)
        data = apply_aliases(data)  # so an override under either name replaces the file's key
    origin = str(path) if path is not None else "defaults"
    if overrides:
        if not isinstance(data, dict):
            return from_dict(data, origin)
        data = apply_overrides(data, overrides)
        origin += " + overrides"
        spellings = respelled(spellings, overrides)
    return from_dict(data, origin, spellings)


def respelled(spellings: dict[str, str], overrides: list[str]) -> dict[str, str]:
    """`spellings` after `overrides`: a key an override set is the override's, under the
    name it gave (a seed's key, or ours)."""
    out = dict(spellings)
    for item in overrides:
        given = item.split("=", 1)[0].strip()
        real = KEY_ALIASES.get(given, given)
        out.pop(real, None)
        if real != given and given.rsplit(".", 1)[-1] != real.rsplit(".", 1)[-1]:
            out[real] = given
    return out


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(config.to_yaml(), encoding="utf-8")
