"""Named registries of extension points (extensions, model adapters, training strategies): a
class decorator adds one under a name, and the name is what configs and calls use."""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches
from typing import Any, Generic, TypeVar

from stackwise.errors import StackWiseError

T = TypeVar("T")


class Registry(Generic[T]):
    """`what` names the kind in errors; `decorator` is the public name of `register`; `hint`
    ends the error for an unknown name."""

    def __init__(self, what: str, decorator: str, hint: str = "") -> None:
        self.entries: dict[str, Callable[[], T]] = {}
        self.what = what
        self.decorator = decorator
        self.hint = hint

    def register(self, name: str) -> Callable[[type[Any]], type[Any]]:
        """Class decorator: the class becomes `name` (its `name` attribute is set too)."""

        def add(cls: type[Any]) -> type[Any]:
            cls.name = name
            self.entries[name] = cls
            return cls

        return add

    def known(self) -> str:
        return ", ".join(sorted(self.entries))

    def create(self, name: str, where: str = "") -> T:
        """A new instance of `name`; an unknown name is a StackWiseError naming the known ones
        (and `where` it was asked for, e.g. a config key)."""
        if name not in self.entries:
            asked = (
                f"{where} names '{name}', which is not registered"
                if where
                else f"No {self.what} is registered as '{name}'"
            )
            near = get_close_matches(name, list(self.entries), n=1)
            hint = f" Did you mean '{near[0]}'?" if near else ""
            raise StackWiseError(
                f"{asked}.{hint} Known: {self.known()}. Register yours with "
                f"@stackwise.{self.decorator}('name') before training."
                + (f" {self.hint}" if self.hint else "")
            )
        return self.entries[name]()
