"""Package names that load their module on first use (PEP 562): importing one module of a
package then does not import every module its `__init__` names."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: dict[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for `package`, whose globals are `namespace`:
    each name in `exports` ({module: names}) is imported from its module when first asked for,
    then kept as a plain attribute."""
    where = {name: module for module, names in exports.items() for name in names}
    names = sorted(where)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # next time a plain attribute
        return value

    def __dir__() -> list[str]:  # the names to come, and what the module holds already
        return sorted({*names, *namespace})

    return __getattr__, __dir__, names
