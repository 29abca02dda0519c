"""The base of every config section, and how cross-field rules are run and reported.

A rule is a small named function that yields the problems it finds (one sentence each, saying
what to change). A section built on its own runs its own rules. A whole config (validated with
the context ALL_RULES, as loading and `derive` do) leaves them to the root, which runs every
section's rules and the rules that span sections, so all problems come back in one message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

YAML_TRUE = frozenset({"yes", "on", "true"})
YAML_FALSE = frozenset({"no", "off", "false"})
QUOTE_HINT = (
    "YAML reads yes/no/on/off/true/false as booleans; to pass the word, quote it: "
    'key=\'"word"\' on the command line, key: "word" in a file'
)

Rule = Callable[[Any], Iterable[str]]
# section class name -> its rules, filled by stackwise.config.rules (imported by the package)
SECTION_RULES: dict[str, list[Rule]] = {}
# rules over the whole config, filled by stackwise.config.rules_cross
CROSS_RULES: list[Rule] = []
# rules that build whole configs from this one (per-stack overrides), filled by rules_growth
DERIVED_RULES: list[Rule] = []
# validation context of a whole config: section rules wait for the root to run them together
ALL_RULES = {"rules": "at_root"}


def section_rule(section: str) -> Callable[[Rule], Rule]:
    """Register a rule that checks one section on its own."""

    def register(fn: Rule) -> Rule:
        SECTION_RULES.setdefault(section, []).append(fn)
        return fn

    return register


def cross_rule(fn: Rule) -> Rule:
    """Register a rule that checks the whole config (run once every section is valid)."""
    CROSS_RULES.append(fn)
    return fn


def derived_rule(fn: Rule) -> Rule:
    """Register a rule that derives whole configs from this one. It runs only once every other
    rule has passed: on a config with problems it would report them all again."""
    DERIVED_RULES.append(fn)
    return fn


def problems_of(target: Any, rules: Iterable[Rule], found: list[str] | None = None) -> list[str]:
    """Every problem every rule finds, added to `found`. A rule that trips over an earlier
    problem (its input is already invalid) is skipped rather than reported twice."""
    found = [] if found is None else found
    for rule in rules:
        try:
            found.extend(rule(target))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            if not found:
                raise
    return found


def joined(problems: list[str]) -> str:
    """One message: the problem itself, or all of them numbered."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems: " + "; ".join(
        f"({i}) {p}" for i, p in enumerate(problems, 1)
    )


class RuleProblems(ValueError):
    """What the rules found: one message for pydantic, the problems kept one by one (a config
    derived from another reports them as its own)."""

    def __init__(self, problems: list[str]) -> None:
        problems = list(dict.fromkeys(problems))  # two rules may find the same problem
        super().__init__(joined(problems))
        self.problems = problems


def _string_choices(annotation: Any) -> tuple[str, ...]:
    """The string choices of a Literal field (also inside `Literal[...] | None`)."""
    if get_origin(annotation) is Literal:
        return tuple(a for a in get_args(annotation) if isinstance(a, str))
    return tuple(c for arg in get_args(annotation) for c in _string_choices(arg))


def _takes_number_not_bool(annotation: Any) -> bool:
    """Whether a field takes an int or float and not a bool (also inside `X | None`)."""

    def kinds(a: Any) -> set[Any]:
        args = get_args(a)
        return {a} if not args or get_origin(a) is Literal else set().union(*map(kinds, args))

    found = kinds(annotation)
    return bool(found & {int, float}) and bool not in found


def _choice_for_bool(choices: tuple[str, ...], value: bool) -> str | None:
    """The one choice whose name YAML would read as `value` (`no` for False), if any."""
    words = YAML_TRUE if value else YAML_FALSE
    matches = [c for c in choices if c.lower() in words]
    return matches[0] if len(matches) == 1 else None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans_as_choices(cls, data: Any) -> Any:
        """`mixed_precision: no` arrives from YAML as False: read it back as the choice `no`."""
        if not isinstance(data, dict):
            return data
        for name, value in list(data.items()):
            field = cls.model_fields.get(name)
            if field is None or not isinstance(value, bool):
                continue
            choice = _choice_for_bool(_string_choices(field.annotation), value)
            if choice is not None:
                data = {**data, name: choice}
            elif _takes_number_not_bool(field.annotation):  # pydantic would read it as 1 / 0
                raise ValueError(
                    f"{name} takes a number, but got a boolean ({str(value).lower()}; YAML "
                    "reads yes/no/on/off/true/false as booleans): give a number"
                )
        return data

    @model_validator(mode="after")
    def _section_rules(self, info: ValidationInfo) -> Section:
        if at_root(info):
            return self
        found = problems_of(self, SECTION_RULES.get(type(self).__name__, []))
        if found:
            raise RuleProblems(found)
        return self

    def changed(self, name: str) -> bool:
        """True when `name` differs from its default (robust to YAML round-trips)."""
        field = type(self).model_fields[name]
        return getattr(self, name) != field.get_default(call_default_factory=True)


def at_root(info: ValidationInfo) -> bool:
    """True while a whole config is validated: the root then runs every rule at once."""
    context = info.context
    return isinstance(context, dict) and context.get("rules") == ALL_RULES["rules"]


def section_problems(node: Any, path: str = "") -> list[str]:
    """The problems of every section's own rules in `node` (nested sections, lists and dict
    values too), each prefixed with where it is."""
    found: list[str] = []
    if isinstance(node, Section):
        own = problems_of(node, SECTION_RULES.get(type(node).__name__, []))
        found += [p if not path or p.startswith(f"{path}.") else f"{path}: {p}" for p in own]
        children: Iterable[tuple[str, Any]] = (
            (k, getattr(node, k)) for k in type(node).model_fields
        )
    elif isinstance(node, dict):
        children = ((str(k), v) for k, v in node.items())
    elif isinstance(node, list | tuple):
        children = ((str(i), v) for i, v in enumerate(node))
    else:
        return found
    for key, child in children:
        found += section_problems(child, f"{path}.{key}" if path else key)
    return found


def set_while_off(section: Section, path: str) -> Iterator[str]:
    """Each setting of a switched-off section (its `enabled` false) that differs from its
    default: it would do nothing, so it is a problem."""
    if not getattr(section, "enabled"):  # noqa: B009 (only switched sections have it)
        for name in type(section).model_fields:
            if name != "enabled" and section.changed(name):
                yield f"{path}.{name} needs {path}.enabled: true"
