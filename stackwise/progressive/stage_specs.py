"""What one progressive stage runs with, from its StageSpec: the plan its Trainer takes, its
objective, its slice of a global LR schedule, and the line announcing it. Pure functions."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from torch.optim.lr_scheduler import LambdaLR

from stackwise import seeds
from stackwise.io.checkpoints import LATEST
from stackwise.objectives import Objective, Specials, objective_from
from stackwise.spec import Plan, StageSpec
from stackwise.train.optim import lr_factor, note_long_warmup


def own_run(plan: Plan, folder: Path, **train: Any) -> Plan:
    """`plan` as one part of a progressive run: its own folder (resumed from its latest
    checkpoint when the run resumes), its budget resolved, no run name of its own."""
    resume = plan.train.resume_from_checkpoint and (folder / LATEST).is_file()
    plan = plan.with_section(
        "train",
        output_dir=str(folder),
        overwrite_output_dir=True,
        resume_from_checkpoint="latest" if resume else None,
        **train,
    )
    plan = plan.with_section("progressive", steps_per_stack=None, epochs_per_stack=None)
    return plan.with_section("logging", run_name=None)


def stage_plan(plan: Plan, stage: StageSpec, folder: Path) -> Plan:
    """The plan a stage's Trainer runs: its budget, seed, LR, objective and folder."""
    plan = plan.with_section("objective", **asdict(stage.objective))
    plan = plan.with_section("masking", **asdict(stage.masking))
    plan = plan.with_section("progressive", stacks={})  # applied: the stage's own settings
    return own_run(plan, folder, max_steps=stage.steps, seed=stage.seed, lr=stage.lr)


def joint_plan(plan: Plan, steps: int, folder: Path) -> Plan:
    """mode fused: the joint tuning of the whole rack after the last stage."""
    return own_run(plan, folder, max_steps=steps, seed=seeds.joint_tuning(plan.train.seed))


def stage_objective(stage: StageSpec, specials: Specials) -> Objective:
    """The stage's objective, over its noise range when time is depth."""
    objective = objective_from(stage.objective, stage.masking, specials)
    if stage.t_range is not None:
        objective = objective.with_range(*stage.t_range)  # type: ignore[attr-defined]
    return objective


def global_schedule(plan: Plan, optimizer: Any, offset: int) -> LambdaLR:
    """A stage's slice of one schedule over every stage's planned steps (lr_schedule global),
    going on from `offset`, the steps the earlier stages ran: the warmup happens once, in
    stage 0, and the LR only decays after it (wsd: only at the end of the run)."""
    whole = replace(plan.train, max_steps=sum(s.steps for s in plan.stages))
    if offset == 0:  # said once, by the first stage
        note_long_warmup(whole, "the steps planned over all stacks")
    return LambdaLR(optimizer, lambda step: lr_factor(offset + step, whole))


def stage_line(
    stage: StageSpec,
    n: int,
    position: int,
    trainable: int,
    carried: int | None,
    inherited: int = 0,
) -> str:
    """The line announcing a stage; `inherited`: the steps earlier stages left it (plateau)."""
    tr = stage.t_range
    return (
        f"stack {stage.index + 1}/{n} at position {position}: {stage.steps} steps"
        + (f" ({inherited} left by earlier stages)" if inherited else "")
        + f", {trainable:,} trainable parameters"
        + (f", t in ({tr[0]:.3f}, {tr[1]:.3f}]" if tr else "")
        + (f", cache carried {carried:,} entries" if carried is not None else "")
    )
