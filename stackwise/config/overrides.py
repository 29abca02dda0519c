"""Dotted overrides (`train.lr=1e-3`): each value read as YAML (free-text fields keep the
words), legacy names set at their real key, and set into a config's data."""

from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml

from stackwise.config.aliases import KEY_ALIASES, SEED_KEYS, apply_implied, convert_seed_value
from stackwise.config.keys import section_of
from stackwise.config.paths import put
from stackwise.config.root import Config
from stackwise.config.seed_layouts.model_trainer import OMIT
from stackwise.errors import StackWiseError


def _field_type(parts: list[str]) -> Any:
    """The annotation of the field a dotted override sets (None past a dict or a typo)."""
    model: Any = Config
    annotation: Any = None
    for part in parts:
        model = section_of(annotation) if annotation is not None else model
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


YAML_NULLS = ("", "null", "Null", "NULL", "~")  # what a value means to be None


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
    elif value is None and raw.strip() not in YAML_NULLS and _takes_words(field):
        value = raw.strip()  # "---" or "..." are YAML document marks, read as empty: a word
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


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`data` with each dotted override set (a later one wins). A legacy name is set at its
    real key, and a number names an existing integer key (`progressive.stacks.0.steps`)."""
    seen: dict[str, str] = {}
    seeded: dict[str, Any] = {}  # the seeds' keys given, as written: their conversions apply
    for item in overrides:
        parts, value = parse_override(item)
        given = ".".join(parts)
        if given in SEED_KEYS:
            seeded[given] = value
            value = convert_seed_value(given, value)
        target = ".".join(_canonical(parts, seen))
        if value is not OMIT:
            put(data, target, value, f"Override '{item}'")
    apply_implied(seeded, data)
    return data
