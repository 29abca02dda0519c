"""Families of pluggable parts, each picked by name: objectives, masking schedules, samplers,
growth operators, parallelizers (declared here), and extensions, model adapters and training
strategies (declared next to their base classes).

An entry joins a family with one decorator line, `@register_objective("name", masked=True)`,
on a class or a factory function; the keywords declare its capabilities, and code asks those
(`OBJECTIVES.capabilities(name).uses_time`) instead of comparing names, so a new entry needs no
edit anywhere else. A family knows the module that holds its built-in entries and imports it on
first use. Names and capabilities of the built-ins are read from their decorator lines without
importing them (config validation and `--help` run before torch is loaded); the implementation
is imported when it is first asked for.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import field, make_dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Generic, TypeVar

from stackwise.errors import StackWiseError

T = TypeVar("T")
E = TypeVar("E")


class Family(Generic[T]):
    """`what` names the kind in errors; `decorator` is how users reach `register` under
    `stackwise.` (e.g. `registry.register_objective`); `hint` ends the error for an unknown
    name; `builtins` is the dotted module holding the built-in entries; `defaults` lists the
    capabilities an entry may declare, with the value an entry that omits one gets."""

    def __init__(
        self,
        what: str,
        decorator: str,
        hint: str = "",
        *,
        builtins: str | None = None,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        self.what, self.decorator, self.hint = what, decorator, hint
        self.builtins = builtins
        self.defaults = dict(defaults or {})
        title = "".join(w.title() for w in what.split())
        fields = [(k, Any, field(default=v)) for k, v in self.defaults.items()]
        self.Capabilities = make_dataclass(f"{title}Capabilities", fields, frozen=True)
        self.entries: dict[str, Callable[..., T]] = {}
        self._declared: dict[str, Any] = {}  # name -> capabilities of registered entries
        self._loaded = builtins is None
        self._index: dict[str, Any] | None = None  # the built-ins read from their source

    # -- joining ------------------------------------------------------------------------------

    def register(self, name: str, **capabilities: Any) -> Callable[[E], E]:
        """Decorator for a class or factory function: it becomes entry `name` (its `name`
        attribute is set too) with the capabilities given (the family's defaults otherwise)."""
        unknown = sorted(set(capabilities) - set(self.defaults))
        if unknown:
            declared = ", ".join(self.defaults) or "none"
            raise StackWiseError(
                f"{self.what} '{name}' declares unknown capabilities {unknown}; a {self.what} "
                f"declares: {declared}."
            )
        caps = self.Capabilities(**capabilities)

        def add(entry: E) -> E:
            self._load()  # a built-in loaded later must not replace this entry
            with contextlib.suppress(AttributeError, TypeError):  # unless it takes none
                entry.name = name  # type: ignore[attr-defined]
            self.entries[name] = entry  # type: ignore[assignment]
            self._declared[name] = caps
            return entry

        return add

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's toy entry, say); absent names are ignored."""
        self.entries.pop(name, None)
        self._declared.pop(name, None)

    # -- asking -------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every registered name, sorted; the built-ins without importing them when they can
        be read from their source."""
        index = {} if self._loaded else self._read_index()
        if index is None:
            self._load()
            index = {}
        return sorted(set(self.entries) | set(index))

    def known(self) -> str:
        return ", ".join(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def capabilities(self, name: str, where: str = "") -> Any:
        """The frozen capabilities `name` declared (attribute access); an unknown name is the
        friendly error (see `get`)."""
        if name in self._declared:
            return self._declared[name]
        if not self._loaded:
            index = self._read_index()
            if index is not None and name in index:
                return index[name]
            self._load()
            if name in self._declared:
                return self._declared[name]
        raise StackWiseError(self.unknown(name, where))

    def capabilities_of(self, entry: Any) -> Any:
        """The capabilities of an entry, or of an instance of one: the nearest registered class
        in its MRO; the family's defaults for something never registered."""
        self._load()
        owners = {id(e): n for n, e in self.entries.items()}
        kinds = entry.__mro__ if isinstance(entry, type) else (entry, *type(entry).__mro__)
        for kind in kinds:
            if id(kind) in owners:
                return self._declared[owners[id(kind)]]
        return self.Capabilities()

    def get(self, name: str, where: str = "") -> Callable[..., T]:
        """The class or factory registered as `name`. An unknown name is a StackWiseError that
        names the nearest known one, all known ones, and the decorator to register with (and
        `where` it was asked for, e.g. a config key)."""
        self._load()
        if name not in self.entries:
            raise StackWiseError(self.unknown(name, where))
        return self.entries[name]

    def create(self, name: str, *args: Any, where: str = "", **kwargs: Any) -> T:
        """A new instance of `name`, built with the arguments given."""
        return self.get(name, where)(*args, **kwargs)

    def unknown(self, name: str, where: str = "") -> str:
        """The error text for a name nobody registered."""
        self._load()
        asked = (
            f"{where} names '{name}', which is not registered"
            if where
            else f"No {self.what} is registered as '{name}'"
        )
        near = get_close_matches(name, list(self.entries), n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        return (
            f"{asked}.{hint} Known: {self.known()}. Register yours with "
            f"@stackwise.{self.decorator}('name') before training."
            + (f" {self.hint}" if self.hint else "")
        )

    def problem(self, name: str, where: str = "") -> str | None:
        """None for a known name, else the error text (what a config validator reports)."""
        return None if name in self else self.unknown(name, where)

    # -- built-ins ----------------------------------------------------------------------------

    def _load(self) -> None:
        if self._loaded or self.builtins is None:
            return
        self._loaded = True  # first: the module's own decorators land here while it imports
        try:
            importlib.import_module(self.builtins)
        except BaseException:
            self._loaded = False
            raise

    def _read_index(self) -> dict[str, Any] | None:
        """The built-ins' names and capabilities from their decorator lines; None when a line
        is not plain literals (the built-ins are then imported instead)."""
        if self._index is None and self.builtins is not None:
            short = self.decorator.rpartition(".")[2]
            found = read_declarations(source_files(self.builtins), short)
            if found is not None:
                self._index = {k: self.Capabilities(**v) for k, v in found.items()}
        return self._index


class Registry(Family[T]):
    """The first families' call shape, kept for their callers: `create(name, where)` builds an
    entry that takes no arguments."""

    def create(self, name: str, where: str = "", *args: Any, **kwargs: Any) -> T:  # type: ignore[override]
        return self.get(name, where)(*args, **kwargs)


def source_files(dotted: str) -> list[Path]:
    """The .py files of module or package `dotted`, found without importing it (or its
    parent packages beyond the first)."""
    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return []
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    if base.is_dir():
        return sorted(base.glob("*.py"))
    module = base.with_suffix(".py")
    return [module] if module.is_file() else []


def read_declarations(files: list[Path], decorator: str) -> dict[str, dict[str, Any]] | None:
    """{name: capabilities} of every `@decorator("name", key=value)` line in `files`; None when
    there are no files or a line's values are not literals."""
    if not files:
        return None
    found: dict[str, dict[str, Any]] = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                func = deco.func if isinstance(deco, ast.Call) else None
                called = getattr(func, "id", None) or getattr(func, "attr", None)
                if called != decorator or not isinstance(deco, ast.Call):
                    continue
                try:
                    name = ast.literal_eval(deco.args[0])
                    found[name] = {k.arg: ast.literal_eval(k.value) for k in deco.keywords}
                except (ValueError, IndexError, TypeError, SyntaxError):
                    return None
    return found


OBJECTIVES: Family[Any] = Family(
    "objective",
    "registry.register_objective",
    builtins="stackwise.objectives",
    defaults={
        "masked": False,  # corrupts inputs with the mask token (a masked sampler generates)
        "uses_time": False,  # draws a diffusion time the rack may be conditioned on
        "causal": False,  # the attention `auto` gives
        "labels_from_batch": False,  # targets are the batch's `labels` (no pretraining text)
        "default_sampler": "remask",  # what sample.sampler `auto` picks
        "nelbo": False,  # reports nelbo/ppl_bound (not ppl); objective.weighting applies
        "masking_fields": (),  # the masking.* keys it reads
        "instruction_rows": False,  # trains on instruction rows (loss on the replies)
        "hf_models": False,  # available for Hugging Face models
        "blocks": False,  # reads objective.block_size (the rack runs the block layout)
    },
)
register_objective = OBJECTIVES.register

SCHEDULES: Family[Any] = Family(
    "masking schedule", "registry.register_schedule", builtins="stackwise.objectives.schedules"
)
register_schedule = SCHEDULES.register

SAMPLERS: Family[Any] = Family(
    "sampler",
    "registry.register_sampler",
    builtins="stackwise.samplers",
    defaults={
        "needs_chain": False,  # runs a rack grown as a denoising chain, one stack per step
        "uses_remasking": False,  # reads sample.remasking
        "reads": (),  # the sample.* settings only this sampler reads
        "blocks": False,  # decodes a block-diffusion rack (objective block_diffusion)
    },
)
register_sampler = SAMPLERS.register

GROWTH_OPERATORS: Family[Any] = Family(
    "growth operator",
    "registry.register_growth_operator",
    builtins="stackwise.growth",
    defaults={
        "preserves_function": False,  # the grown rack computes what it did before (noise 0)
        "copies_trunk": False,  # the new stack starts as a copy of a trained stack
    },
)
register_growth_operator = GROWTH_OPERATORS.register

PARALLELIZERS: Family[Any] = Family(
    "parallelizer",
    "registry.register_parallelizer",
    builtins="stackwise.parallel",
    defaults={
        "shards": False,  # splits parameters over ranks
        "wraps_model": True,  # the model is wrapped (DDP); False: gradients synced by hand
    },
)
register_parallelizer = PARALLELIZERS.register
