"""Config fields that name a registered entry (stackwise.registry): a plain string checked
against its family, so a newly registered objective, schedule, sampler, growth operator or
parallelizer needs no config edit.
An unknown name is the registry's own error (nearest match, known names, how to register)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

from stackwise.registry import (
    GROWTH_OPERATORS,
    OBJECTIVES,
    PARALLELIZERS,
    SAMPLERS,
    SCHEDULES,
    Family,
)


def registered(family: Family[Any], *allow: str, refused: dict[str, str] | None = None) -> Any:
    """A str type whose value must be registered in `family` (or be one of `allow`); a name in
    `refused` is refused with its own reason (a known kind that is not available)."""

    def check(name: str) -> str:
        if refused and name in refused:
            raise ValueError(refused[name])
        problem = None if name in allow else family.problem(name)
        if problem is not None:
            also = " or ".join(f"'{a}'" for a in allow)
            raise ValueError(problem + (f" It also takes {also}." if allow else ""))
        return name

    return Annotated[str, AfterValidator(check)]


ObjectiveName = registered(OBJECTIVES)
ScheduleName = registered(SCHEDULES)
SamplerName = registered(SAMPLERS, "auto")
GrowthOperatorName = registered(GROWTH_OPERATORS)
ParallelizerName = registered(PARALLELIZERS, "auto")
