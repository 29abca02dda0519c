"""The seeds' attribute paths on a loaded config: `config.training.resume_from_checkpoint`
(seed 001) and `config.training.progressive.trunk_strategy = "qlora"` (seed 003) read and write
the real keys, through the same table a config file's seed keys go through."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from stackwise.config.aliases import SEED_KEYS, convert_seed_value
from stackwise.config.linked import linked_model_keys
from stackwise.config.seed_layouts import model_trainer
from stackwise.errors import StackWiseError


def get_path(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        node = (
            node[int(part) if isinstance(node, dict) and part.isdigit() else part]
            if (isinstance(node, dict))
            else getattr(node, part)
        )
    return node


def set_path(config: Any, path: str, value: Any) -> None:
    """Set a dotted key on a config, its value checked against the key's type. The rules
    that relate keys wait for the whole config's check (`config.validate()`, which every seed
    entry point runs): the seeds set related keys one statement at a time."""
    *sections, leaf = path.split(".")
    node = get_path(config, ".".join(sections)) if sections else config
    if isinstance(node, dict):
        node[leaf] = value
        return
    field = type(node).model_fields.get(leaf)
    if field is None:
        raise StackWiseError(f"{path} is not a config key.")
    try:
        kind = Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
        checked = TypeAdapter(kind).validate_python(value)
    except ValidationError as err:
        reason = err.errors()[0]["msg"]
        raise StackWiseError(f"{path} = {value!r} is refused: {reason}.") from None
    node.__dict__[leaf] = checked
    node.__pydantic_fields_set__.add(leaf)


class SeedView:
    """The keys a seed writes under `prefix` (`training.`), as attributes of a config."""

    def __init__(self, config: Any, prefix: str) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_prefix", prefix)

    def _names(self) -> list[str]:
        prefix = self._prefix
        return sorted({p[len(prefix) :].split(".")[0] for p in SEED_KEYS if p.startswith(prefix)})

    def _missing(self, name: str) -> StackWiseError:
        where = self._prefix.rstrip(".")
        return StackWiseError(
            f"The seeds' '{where}' has no key '{name}'; it takes: {', '.join(self._names())}."
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        path = self._prefix + name
        if path in SEED_KEYS:
            try:
                return get_path(self._config, SEED_KEYS[path].target)
            except KeyError:  # an entry of a free-form mapping (train.strategy_options)
                target = SEED_KEYS[path].target
                raise AttributeError(f"'{path}' ({target}) is not set") from None
        if any(p.startswith(path + ".") for p in SEED_KEYS):
            return SeedView(self._config, path + ".")
        raise self._missing(name)

    def __setattr__(self, name: str, value: Any) -> None:
        path = self._prefix + name
        if path not in SEED_KEYS:
            raise self._missing(name)
        converted = convert_seed_value(path, value)
        if converted is model_trainer.OMIT:
            return
        target = SEED_KEYS[path].target
        set_path(self._config, target, converted)
        if target.startswith("progressive."):  # the model keys it decides follow it
            progressive = self._config.progressive.model_dump()
            for key, (value, _) in linked_model_keys(progressive).items():
                set_path(self._config, f"model.{key}", value)

    def __dir__(self) -> list[str]:
        return self._names()

    def __repr__(self) -> str:
        return f"<the seeds' {self._prefix.rstrip('.')} keys of a StackWise config>"
