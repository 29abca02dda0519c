"""Reading configs: files (YAML via safe_load, or JSON), dotted overrides, aliases, and errors
that name the key and the fix."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from stackwise.config.aliases import KEY_ALIASES, apply_aliases
from stackwise.config.base import ALL_RULES, QUOTE_HINT
from stackwise.config.root import Config
from stackwise.config.sections import MaskingConfig
from stackwise.errors import StackWiseError


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _check_keys(data: Any, model: type[BaseModel]) -> None:
    """Reject unknown keys, every one of them at once, each with its nearest-match hint, before
    pydantic sees them."""
    found = list(_unknown_keys(data, model))
    if len(found) == 1:
        where, suggestion, valid = found[0]
        raise StackWiseError(f"Unknown config key '{where}'{suggestion} Valid keys here: {valid}.")
    if found:
        listed = "; ".join(f"'{where}'{suggestion.rstrip('?')}" for where, suggestion, _ in found)
        raise StackWiseError(
            f"{len(found)} unknown config keys: {listed}. Fix or remove each; `stackwise config "
            "show` prints every valid key."
        )


# free-form dict fields that hold some keys of a section: checked against that section's keys
PARTIAL_SECTIONS: dict[tuple[str, str], type[BaseModel]] = {
    ("StackOverride", "masking"): MaskingConfig
}


def _unknown_keys(
    data: Any, model: type[BaseModel], path: str = ""
) -> Iterator[tuple[str, str, str]]:
    """(dotted key, ' — did you mean ...?' or '', the valid keys there) of each unknown key."""
    if not isinstance(data, dict):
        return
    names = _field_names(model)
    for key, value in data.items():
        where = f"{path}{key}"
        if not isinstance(key, str) or key not in names:
            hint = _nearest(str(key), model, top=not path)
            yield where, f" — did you mean '{hint}'?" if hint else "", ", ".join(names)
            continue
        annotation = model.model_fields[key].annotation
        sub = _section_of(annotation) or PARTIAL_SECTIONS.get((model.__name__, key))
        if sub is not None:
            yield from _unknown_keys(value, sub, f"{where}.")
        elif get_origin(annotation) is list and isinstance(value, list):
            item = _section_of(get_args(annotation)[0])  # data.mix.<i>.*
            for i, v in enumerate(value) if item is not None else ():
                yield from _unknown_keys(v, item, f"{where}.{i}.")
        elif get_origin(annotation) is dict and isinstance(value, dict):
            item = _section_of(get_args(annotation)[1])  # progressive.stacks.<k>.*
            for k, v in value.items() if item is not None else ():
                yield from _unknown_keys(v, item, f"{where}.{k}.")


def _nearest(key: str, model: type[BaseModel], top: bool) -> str | None:
    """The closest valid key; at the top level also one level down, so `blocks_per_stack`
    finds model.*."""
    names = _field_names(model)
    owners = [f"{s}.{key}" for s in names if top and key in _field_names(_sub(model, s))]
    if owners:  # `lr` is train.lr: a section's own key beats a look-alike section (lora)
        return "' or '".join(owners)
    hint = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    if hint:
        return hint[0]
    for sec in names if top else ():
        sub = model.model_fields[sec].annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            close = difflib.get_close_matches(key, _field_names(sub), 1, 0.7)
            if close:
                return f"{sec}.{close[0]}"
    return None


def _sub(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The section a field holds (BaseModel, which has no fields, for a plain value)."""
    return _section_of(model.model_fields[name].annotation) or BaseModel


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: `Section` or `Section | None`."""
    union = get_origin(annotation) in (Union, UnionType)
    for kind in (annotation, *(get_args(annotation) if union else ())):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def _field_type(parts: list[str]) -> Any:
    """The annotation of the field a dotted override sets (None past a dict or a typo)."""
    model: Any = Config
    annotation: Any = None
    for part in parts:
        model = _section_of(annotation) if annotation is not None else model
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
    return annotation


def _takes_words(annotation: Any) -> bool:
    """Whether a field takes free text where YAML would read a bool, number or mapping (choice
    fields keep their own reading of YAML booleans: see config.base)."""
    if annotation is str:
        return True
    if get_origin(annotation) not in (Union, UnionType):
        return False
    return any(_takes_words(a) for a in get_args(annotation))


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


def from_dict(data: Any, origin: str = "config") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise StackWiseError(
            f"{origin} must be a mapping of sections (model:, data:, train: ...), "
            f"but it holds a {type(data).__name__}."
        )
    data = apply_aliases(data)
    _check_keys(data, Config)
    return validated(data, origin)


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


def parse_override(item: str) -> tuple[list[str], Any]:
    """`train.lr=1e-3` -> (['train', 'lr'], 0.001); the value is read as YAML."""
    if "=" not in item:
        raise StackWiseError(
            f"Override '{item}' is not of the form section.key=value (e.g. train.max_steps=50)."
        )
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise StackWiseError(f"Override key '{key}' is malformed; use section.key=value.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    field = _field_type(parts)
    listed = isinstance(value, list) and list in map(get_origin, (field, *get_args(field)))
    if value is not None and not isinstance(value, str) and not listed and _takes_words(field):
        value = raw.strip()  # sample.prompt=no is the word "no", not False
    return parts, value


def _canonical(parts: list[str], seen: dict[str, str]) -> list[str]:
    """An override's key with a legacy name replaced by its real key, so `eval_steps=50`
    overrides a file's `train.eval_every`; the two names together are refused, as in a file."""
    given = ".".join(parts)
    target = KEY_ALIASES.get(given, given)
    if seen.setdefault(target, given) != given:
        raise StackWiseError(
            f"Overrides set both '{seen[target]}' and '{given}', which name the same key "
            f"({target}); keep one of them."
        )
    return target.split(".")


def _key(node: dict[str, Any], part: str) -> Any:
    """`part`, or the integer key it spells when `node` has one (`progressive.stacks.0`)."""
    return int(part) if part.isdigit() and part not in node and int(part) in node else part


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`data` with each dotted override set (a later one wins). A legacy name is set at its
    real key, and a number names an existing integer key (`progressive.stacks.0.steps`)."""
    seen: dict[str, str] = {}
    for item in overrides:
        parts, value = parse_override(item)
        parts = _canonical(parts, seen)
        node = data
        for p in parts[:-1]:
            key = _key(node, p)
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise StackWiseError(f"Override '{item}': '{p}' is a value, not a section.")
            node = child
        node[_key(node, parts[-1])] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data = read_file(path) if path is not None else {}
    if isinstance(data, dict):
        data = apply_aliases(data)  # so an override under either name replaces the file's key
    origin = str(path) if path is not None else "defaults"
    if overrides:
        if not isinstance(data, dict):
            return from_dict(data, origin)
        data = apply_overrides(data, overrides)
        origin += " + overrides"
    return from_dict(data, origin)


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(config.to_yaml(), encoding="utf-8")
