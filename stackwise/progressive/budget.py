"""How many steps each progressive stage trains (progressive.growth.schedule).

`fixed` and `budget_share` are decided at the door (stackwise.plan; `share_split` rounds the
shares). `plateau` decides as the run goes: a stage ends once its validation loss stalls
(PlateauStop), and the steps it did not use go to the next stage. That budget is computed from
the finished stages' records, which the run's history keeps, so a resumed run gives its next
stage the very budget an uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.progressive.records import StackRecord
from stackwise.progressive.stage_specs import global_schedule
from stackwise.spec import Plan, StageSpec
from stackwise.train.best import EarlyStopping
from stackwise.train.extensions import Extension
from stackwise.train.optim import build_scheduler
from stackwise.train.state import RunInfo, Stage


def default_shares(n_stacks: int) -> list[float]:
    """Stack k weighs k + 1: the deeper the rack, the longer its stage trains."""
    return [float(k + 1) for k in range(n_stacks)]


def share_split(total: int, weights: Sequence[float]) -> list[int]:
    """`total` steps split in proportion to `weights`, rounded so they sum to `total` exactly:
    each stack gets the whole part of its share, and the steps left over go to the largest
    remainders (the later stack first on a tie, as later stages hold the deeper rack)."""
    exact = [Fraction(total) * Fraction(w) / sum(map(Fraction, weights)) for w in weights]
    out = [int(x) for x in exact]  # exact, non-negative: int() is the floor
    order = sorted(range(len(exact)), key=lambda i: (exact[i] - out[i], i), reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


class PlateauStop(EarlyStopping):
    """growth.schedule plateau: ends a stage once its val loss has not fallen by more than
    growth.min_delta for growth.patience evaluations in a row (early stopping's rule, on the
    stage's own loss), so the rack grows; the recipe passes the steps left to the next stage."""

    name = "growth_plateau"

    def __init__(self, patience: int, min_delta: float, budget: int) -> None:
        super().__init__()
        self.patience, self.min_delta, self.budget = patience, min_delta, budget

    def watching(self, run: RunInfo) -> tuple[str, int | None, float, bool]:
        return "loss", self.patience, self.min_delta, False

    def stop_note(self, run: RunInfo, metric: str, threshold: float) -> str:
        step = run.state.step
        return (
            f"val/{metric} has not fallen by more than {threshold} for {self.bad_evals} evals: "
            f"the rack grows after step {step} of {self.budget}, passing {self.budget - step} "
            "steps to the next stage"
        )


@dataclass
class StageRun:
    """One stage as it runs: its spec with the steps it gets, the steps earlier stages left it
    (`inherited`), the steps they ran (`offset`: where a global LR schedule goes on from), and
    the extension that ends it on a plateau (None: it trains its whole budget)."""

    stage: StageSpec
    inherited: int = 0
    offset: int = 0
    plateau: PlateauStop | None = None
    spent: tuple[float, int] = (0.0, 0)  # the finished stages' training FLOPs and tokens

    @classmethod
    def of(cls, plan: Plan, index: int, n_stacks: int, done: Sequence[StackRecord]) -> StageRun:
        """Stage `index` of a run growing to `n_stacks`, after the finished stages `done`.
        Under plateau it gets its planned steps plus what the finished stages did not use,
        so the run never trains more steps than the fixed plan; the last stage has nothing
        to grow into and trains all it gets."""
        planned, ran = plan.stages[index], sum(r.steps for r in done)
        spent = (sum(r.flops for r in done), sum(r.tokens for r in done))
        growth = plan.progressive.growth
        if growth.schedule != "plateau":
            return cls(planned, offset=ran, spent=spent)
        left = sum(plan.stages[r.index].steps for r in done) - ran
        stage = replace(planned, steps=planned.steps + left)
        last = index >= n_stacks - 1
        stop = None if last else PlateauStop(growth.patience, growth.min_delta, stage.steps)
        return cls(stage, left, ran, stop, spent)

    def label(self, n_stacks: int) -> Stage:
        """How the stage's Trainer runs: its progress label, loggers kept open for its stack's
        report, and what the finished stages spent before it."""
        index = self.stage.index
        flops, tokens = self.spent
        label = f"stack {index + 1}/{n_stacks}"
        return Stage(index, label, defer_finish=True, flops_before=flops, tokens_before=tokens)

    def scheduler(self, plan: Plan, stage_plan: Plan) -> Callable[[Any], Any]:
        """lr_schedule global: this stage's slice of the run's one LR schedule (`plan`'s),
        going on from the steps the earlier stages ran; else the stage's own schedule over
        its budget (`stage_plan`'s)."""
        if plan.progressive.lr_schedule != "global":
            span = f"stack {self.stage.index + 1}'s budget"
            return lambda optimizer: build_scheduler(optimizer, stage_plan.train, span)
        return lambda optimizer: global_schedule(plan, optimizer, self.offset)

    def extensions(self) -> list[Extension]:
        return [self.plateau] if self.plateau is not None else []

    def outcome(self) -> dict[str, Any]:
        """The record's fields on the budget: the steps given, and whether it plateaued."""
        stopped = self.plateau is not None and self.plateau.stopped_at is not None
        return {"budget": self.stage.steps, "stopped_on_plateau": stopped}


def check_plateau(plan: Plan, val_rows: int | None) -> None:
    """Before the first stage: a plateau needs validation data, and evaluations inside every
    stage that can end on one (patience of them, every train.eval_every steps)."""
    growth = plan.progressive.growth
    if growth.schedule != "plateau":
        return
    if not val_rows:
        raise StackWiseError(
            "progressive.growth.schedule is 'plateau', which grows the rack when the "
            "validation loss stops falling, but this run has no validation data. Give it some "
            "(data.val_fraction, data.eval_files, or an eval_dataloader), or use "
            "growth.schedule 'fixed' or 'budget_share'."
        )
    need = growth.patience * plan.train.eval_every
    short = [s for s in plan.stages[:-1] if s.steps <= need]
    if short:
        raise StackWiseError(
            f"progressive.growth.schedule 'plateau' ends a stage after growth.patience="
            f"{growth.patience} evaluations without improvement, one every train.eval_every="
            f"{plan.train.eval_every} steps, so a stage needs more than {need} steps; stack "
            f"{short[0].index} gets {short[0].steps}. Lower train.eval_every or growth.patience, "
            "or give the stages more steps."
        )
