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
