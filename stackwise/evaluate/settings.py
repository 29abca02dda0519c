"""What `stackwise eval` is asked to do: how finely it scores and how much it samples."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvalSettings:
    t_points: int = 16
    mc_num: int = 8
    samples: int = 16
    max_blocks: int = 64  # validation blocks scored (all when fewer)
    seed: int = 0

    def masked_only(self) -> list[str]:
        """The flags set away from their defaults that only a masked rack's scoring reads."""
        default = EvalSettings()
        pairs = (("--t-points", "t_points"), ("--mc-num", "mc_num"))
        return [flag for flag, name in pairs if getattr(self, name) != getattr(default, name)]
