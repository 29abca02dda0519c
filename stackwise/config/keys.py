"""Unknown config keys: each one found (in nested sections, lists and per-stack entries too)
and refused with the nearest valid key."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from stackwise.config.sections import MaskingConfig
from stackwise.errors import StackWiseError


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def check_keys(data: Any, model: type[BaseModel]) -> None:
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
            hint = nearest(str(key), model, top=not path)
            yield where, f" — did you mean '{hint}'?" if hint else "", ", ".join(names)
            continue
        annotation = model.model_fields[key].annotation
        sub = section_of(annotation) or PARTIAL_SECTIONS.get((model.__name__, key))
        if sub is not None:
            yield from _unknown_keys(value, sub, f"{where}.")
        elif get_origin(annotation) is list and isinstance(value, list):
            item = section_of(get_args(annotation)[0])  # data.mix.<i>.*
            for i, v in enumerate(value) if item is not None else ():
                yield from _unknown_keys(v, item, f"{where}.{i}.")
        elif get_origin(annotation) is dict and isinstance(value, dict):
            item = section_of(get_args(annotation)[1])  # progressive.stacks.<k>.*
            for k, v in value.items() if item is not None else ():
                yield from _unknown_keys(v, item, f"{where}.{k}.")


def nearest(key: str, model: type[BaseModel], top: bool) -> str | None:
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
    return section_of(model.model_fields[name].annotation) or BaseModel


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: `Section` or `Section | None`."""
    union = get_origin(annotation) in (Union, UnionType)
    for kind in (annotation, *(get_args(annotation) if union else ())):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None
