"""Whether a piece of code is stackwise's own: where stackwise changes a contract for speed
(the logits' dtype on their way to the loss), code written outside it keeps the old one."""

from __future__ import annotations

from typing import Any


def stackwise_code(function: Any) -> bool:
    """Whether a function or (class's) method was defined in the stackwise package."""
    return getattr(function, "__module__", "").startswith("stackwise.")
