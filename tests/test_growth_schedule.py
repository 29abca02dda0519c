"""When the rack grows (progressive.growth.schedule) and the LR it grows under.

budget_share splits train.max_steps over the stacks by growth.shares; plateau ends a stage
when its val loss stalls and passes the steps it did not use to the next stage, so a run never
trains more than the fixed plan, and a resumed run gives each stage the same budget; the WSD
schedule holds the LR through growth and decays it once, at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
from collections.abc import Iterator
from typing import ClassVar

import pytest
import torch

from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config
from stackwise.plan import compile_plan
from stackwise.progressive import summary_table
from stackwise.progressive.budget import check_plateau, default_shares, share_split
from stackwise.spec import TrainSpec
from stackwise.train.extensions import REGISTRY, Extension
from stackwise.train.interrupts import TrainingInterrupted
from stackwise.train.optim import long_warmup, lr_factor

# a flat val loss: an LR too small to move it, and a min_delta larger than its jitter
FLAT = {"lr": 1e-9, "eval_every": 2}
PLATEAU = {"schedule": "plateau", "patience": 1, "min_delta": 0.05}


def grown(tiny, n_stacks=3, growth=None, progressive=None, **sections):
    """A progressive diffusion run of `n_stacks` one-block stacks, max_steps 24."""
    return tiny(
        model={"n_stacks": n_stacks, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        progressive={"strategy": "progressive", "growth": growth or {}, **(progressive or {})},
        train={"max_steps": 24, "overwrite_output_dir": True, **sections.pop("train", {})},
        **sections,
    )


def with_train(cfg, **train):
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


def records(result) -> list[tuple[int, int | None, bool]]:
    """(steps run, steps given, stopped on a plateau) per stage."""
    return [(r.steps, r.budget, r.stopped_on_plateau) for r in result.progressive.stacks]


@contextlib.contextmanager
def registered(name: str, make) -> Iterator[None]:
    REGISTRY[name] = make
    try:
        yield
    finally:
        del REGISTRY[name]


class LrLog(Extension):
    """Keeps every logged train/lr with its stage: (stage, step, lr)."""

    seen: ClassVar[list[tuple[int | None, int, float]]] = []

    def on_log(self, run, metrics) -> None:
        if "train/lr" in metrics:
            LrLog.seen.append((run.stack_index, run.state.step, metrics["train/lr"]))


class SignalOn(Extension):
    """SIGINT from `hook` while stage `stack` runs (at `step`, for on_step_end)."""

    def __init__(self, hook: str, stack: int, step: int | None = None) -> None:
        self.stack, self.step = stack, step
        setattr(self, hook, self._send)

    def _send(self, run, *args) -> None:
        if run.stack_index == self.stack and self.step in (None, run.state.step):
            os.kill(os.getpid(), signal.SIGINT)


# -- budget_share -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (10, [1, 2, 3], [2, 3, 5]),  # 1.67, 3.33, 5: the largest remainder takes the last step
        (10, [1, 1, 1], [3, 3, 4]),  # a tie: the later (deeper) stack first
        (7, [0.5, 0.25, 0.25], [3, 2, 2]),  # 3.5, 1.75, 1.75
        (600, [1.0], [600]),
        (101, [3, 3, 3, 1], [30, 30, 31, 10]),
    ],
)
def test_share_split_rounds_to_the_total(total, weights, expected):
    assert share_split(total, weights) == expected
    assert sum(share_split(total, weights)) == total


def test_budget_share_splits_max_steps_by_default_and_given_shares(tiny):
    default = compile_plan(grown(tiny, growth={"schedule": "budget_share"}), train_rows=100)
    assert default_shares(3) == [1.0, 2.0, 3.0]
    assert [s.steps for s in default.stages] == [4, 8, 12]  # 24 in the ratio 1:2:3
    given = grown(tiny, growth={"schedule": "budget_share", "shares": [1, 1, 2]})
    assert [s.steps for s in compile_plan(given, train_rows=100).stages] == [6, 6, 12]
    odd = grown(tiny, growth={"schedule": "budget_share"}, train={"max_steps": 10})
    assert [s.steps for s in compile_plan(odd, train_rows=100).stages] == [2, 3, 5]


def test_budget_share_splits_the_budget_epochs_resolve_to(tiny):
    cfg = tiny(
        model={"n_stacks": 3, "blocks_per_stack": 1},
        progressive={"strategy": "progressive", "growth": {"schedule": "budget_share"}},
        train={"max_steps": 600, "num_train_epochs": 2.0, "batch_size": 4},  # the default
    )
    plan = compile_plan(cfg, train_rows=30)  # 2 epochs of 30 rows, 4 a step: 15 steps
    assert plan.train.max_steps == 15
    assert [s.steps for s in plan.stages] == [2, 5, 8] and sum(s.steps for s in plan.stages) == 15


def test_budget_share_run_trains_each_stage_its_share(tiny):
    cfg = grown(tiny, growth={"schedule": "budget_share", "shares": [1, 3]}, n_stacks=2)
    result = train_from_config(with_train(cfg, max_steps=8), quiet=True)
    assert records(result) == [(2, 2, False), (6, 6, False)]


def test_a_share_that_rounds_to_no_step_is_refused_at_the_door(tiny):
    cfg = grown(tiny, growth={"schedule": "budget_share", "shares": [1, 1000, 1]})
    with pytest.raises(StackWiseError, match="leaves stack 0 no step"):
        compile_plan(cfg, train_rows=100)


@pytest.mark.parametrize(
    ("growth", "progressive", "train", "match"),
    [
        ({"schedule": "budget_share", "shares": [1, 2]}, {}, {}, "2 weights for model.n_stacks=3"),
        ({"shares": [1, 2, 3]}, {}, {}, r"shares only applies to growth.schedule: budget_share"),
        ({"patience": 3}, {}, {}, r"growth.patience only applies to growth.schedule: plateau"),
        (
            {"schedule": "budget_share", "min_delta": 0.1},
            {},
            {},
            r"growth.min_delta only applies",
        ),
        (
            {"schedule": "budget_share"},
            {"steps_per_stack": 5},
            {"max_steps": 600},
            r"keep budget_share and remove progressive.steps_per_stack",
        ),
        (
            {"schedule": "budget_share"},
            {"epochs_per_stack": 1.0},
            {"max_steps": 600},
            r"remove progressive.epochs_per_stack",
        ),
        (
            {"schedule": "budget_share"},
            {"stacks": {1: {"steps": 3}}},
            {},
            r"progressive.stacks.1.steps sets a stage's budget itself",
        ),
        ({"schedule": "budget_share"}, {}, {"max_steps": 2}, "each of the 3 stacks a step"),
        ({}, {}, {"num_train_epochs": 1.0}, "or progressive.growth.schedule budget_share"),
        (PLATEAU, {}, {"early_stopping_patience": 2}, "remove train.early_stopping"),
        (PLATEAU, {}, {"eval_every": 8}, "needs more than 8 steps, and stack 0 gets 8"),
        (
            {**PLATEAU, "patience": 3},
            {"stacks": {1: {"steps": 12}}},
            {"eval_every": 3},
            "needs more than 9 steps",
        ),
    ],
)
def test_schedule_settings_that_cannot_work_are_refused(tiny, growth, progressive, train, match):
    with pytest.raises(StackWiseError, match=match):
        grown(tiny, growth=growth, progressive=progressive, train=train)


def test_plateau_on_a_rack_that_never_grows_is_refused(tiny):
    with pytest.raises(StackWiseError, match=r"model\.n_stacks=1 it never grows"):
        grown(tiny, n_stacks=1, growth=PLATEAU)


@pytest.mark.parametrize("growth", [{"init": "copy_last"}, {"noise": 0.1}])
def test_a_growth_operator_on_a_rack_that_never_grows_is_refused(tiny, growth):
    with pytest.raises(StackWiseError, match=r"with model\.n_stacks=1 none is"):
        grown(tiny, n_stacks=1, growth=growth)


def test_plateau_needs_validation_data_and_room_in_stages_known_from_epochs(tiny):
    plan = compile_plan(grown(tiny, growth=PLATEAU, train=FLAT), train_rows=100)
    check_plateau(plan, 10)  # 8 steps a stage, an eval every 2: room to stop
    with pytest.raises(StackWiseError, match="no validation data"):
        check_plateau(plan, 0)
    by_epochs = grown(
        tiny,
        growth=PLATEAU,
        progressive={"epochs_per_stack": 1.0},
        train={"eval_every": 4, "max_steps": 600},
    )
    # the load could not know: 1 epoch of 12 rows, 4 a step, is 3 steps a stage
    with pytest.raises(StackWiseError, match="stack 0 gets 3"):
        check_plateau(compile_plan(by_epochs, train_rows=12), 10)


# -- plateau ----------------------------------------------------------------------------------


def test_plateau_grows_on_a_flat_loss_and_passes_the_steps_on(tiny, tmp_path, capsys):
    cfg = grown(tiny, growth=PLATEAU, train=FLAT)
    fixed = train_from_config(grown(tiny, train=FLAT), quiet=True)
    assert records(fixed) == [(8, 8, False)] * 3
    result = train_from_config(cfg, quiet=False)
    # stage 0 stops at its first eval (step 2) and leaves 6; stage 1 gets 8 + 6 and leaves 12;
    # the last stage has nothing to grow into and trains all that is left
    assert records(result) == [(2, 8, True), (2, 14, True), (20, 20, False)]
    total = sum(r.steps for r in result.progressive.stacks)
    assert total == sum(r.steps for r in fixed.progressive.stacks) == 24
    out = capsys.readouterr().out
    assert "stack 2/3 at position 1: 14 steps (6 left by earlier stages)" in out
    assert "passing 12 steps to the next stage" in out
    history = json.loads((tmp_path / "run" / "progressive_history.json").read_text())
    assert [(s["steps"], s["budget"], s["stopped_on_plateau"]) for s in history["stacks"]] == [
        (2, 8, True),
        (2, 14, True),
        (20, 20, False),
    ]
    table = summary_table(result.progressive).splitlines()
    assert table[2].split()[2] == "2*" and table[4].split()[2] == "20"
    assert "stopped on a plateau" in table[5]


def test_plateau_keeps_a_stage_going_while_its_loss_falls(tiny):
    """A real LR makes the loss fall by more than min_delta at each eval: no stage stops."""
    cfg = grown(
        tiny, 2, growth={"schedule": "plateau", "patience": 1}, train={"lr": 1e-2, "eval_every": 2}
    )
    result = train_from_config(with_train(cfg, max_steps=8), quiet=True)
    assert records(result) == [(4, 4, False), (4, 4, False)]


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("stop_as_stage_0_ends", lambda: SignalOn("on_stack_end", stack=0)),
        ("stop_in_stage_1", lambda: SignalOn("on_step_end", stack=1, step=1)),
    ],
)
def test_a_resumed_plateau_run_gives_each_stage_the_uninterrupted_budget(
    tiny, tmp_path, name, make
):
    cfg = grown(tiny, growth=PLATEAU, train=FLAT)
    full = train_from_config(with_train(cfg, output_dir=str(tmp_path / "full")), quiet=True)
    with registered(name, make), pytest.raises(TrainingInterrupted):
        train_from_config(with_train(cfg, enabled_extensions=[name]), quiet=True)
    resumed = train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    assert records(resumed) == records(full) == [(2, 8, True), (2, 14, True), (20, 20, False)]
    a, b = full.rack.state_dict(), resumed.rack.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_global_schedule_follows_the_steps_the_stages_ran(tiny):
    """lr_schedule global under plateau: each stage goes on from the steps run before it, and
    the last stage ends the one schedule over the full budget (24 steps)."""
    LrLog.seen = []
    train = {**FLAT, "scheduler": "linear", "min_lr_ratio": 0.1, "enabled_extensions": ["lrs"]}
    cfg = grown(
        tiny,
        growth=PLATEAU,
        progressive={"lr_schedule": "global"},
        train=train,
        logging={"log_every": 1},
    )
    with registered("lrs", LrLog):
        train_from_config(cfg, quiet=True)
    whole = TrainSpec(max_steps=24, scheduler="linear", min_lr_ratio=0.1)
    offsets = {0: 0, 1: 2, 2: 4}  # the steps run before each stage
    assert {s for s, _, _ in LrLog.seen} == {0, 1, 2}
    for stage, step, lr in LrLog.seen:
        assert lr == pytest.approx(1e-9 * lr_factor(offsets[stage] + step, whole))
    assert LrLog.seen[-1] == (2, 20, pytest.approx(1e-10))  # the schedule's end


# -- the WSD schedule -------------------------------------------------------------------------


def test_wsd_warms_up_holds_then_decays_linearly_to_the_floor():
    spec = TrainSpec(
        max_steps=100, warmup_steps=10, scheduler="wsd", decay_ratio=0.2, min_lr_ratio=0.1
    )
    assert [lr_factor(s, spec) for s in (0, 5)] == [0.0, 0.5]
    assert all(lr_factor(s, spec) == 1.0 for s in range(10, 81))  # stable until the last 20%
    assert lr_factor(90, spec) == pytest.approx(0.55)
    assert lr_factor(100, spec) == pytest.approx(0.1)
    falling = [lr_factor(s, spec) for s in range(80, 101)]
    assert all(b < a for a, b in itertools.pairwise(falling))


def test_wsd_with_a_global_schedule_holds_the_lr_through_growth(tiny):
    LrLog.seen = []
    train = {
        "lr": 1e-3,
        "scheduler": "wsd",
        "warmup_steps": 2,
        "decay_ratio": 0.25,
        "min_lr_ratio": 0.0,
        "enabled_extensions": ["lrs"],
    }
    cfg = grown(
        tiny,
        2,
        progressive={"lr_schedule": "global", "steps_per_stack": 6},
        train={**train, "max_steps": 600},
        logging={"log_every": 1},
    )
    with registered("lrs", LrLog):
        train_from_config(cfg, quiet=True)
    first = [lr for stage, _, lr in LrLog.seen if stage == 0]
    second = [lr for stage, _, lr in LrLog.seen if stage == 1]
    assert first[0] == pytest.approx(5e-4)  # the warmup, once
    assert first[1:] == [pytest.approx(1e-3)] * 5  # stable up to the boundary...
    assert second[:3] == [pytest.approx(1e-3)] * 3  # ...and across it (steps 7-9 of 12)
    assert second[3:] == [pytest.approx(2e-3 / 3), pytest.approx(1e-3 / 3), 0.0]  # one decay


def test_decay_ratio_needs_the_wsd_scheduler(tiny):
    with pytest.raises(StackWiseError, match="decay_ratio only applies to scheduler: wsd"):
        tiny(train={"decay_ratio": 0.3})


def test_a_schedule_key_that_does_nothing_says_how_to_undo_a_preset(tiny):
    """The fix names the default that turns a preset's value off, and that fix is taken."""
    with pytest.raises(StackWiseError, match=r"set train\.min_lr_ratio=0\.0 \(its default\)"):
        tiny(train={"scheduler": "constant", "min_lr_ratio": 0.1})
    assert tiny(train={"scheduler": "constant", "min_lr_ratio": 0.0}).train.min_lr_ratio == 0.0


@pytest.mark.parametrize(
    ("scheduler", "warmup", "said"),
    [
        ("cosine", 50, "to 58% of train.lr at the last step, and never decays (cosine)"),
        ("wsd", 30, "to 97% of train.lr at the last step, and never decays (wsd)"),
        ("constant_with_warmup", 40, "to 72% of train.lr at the last step."),
    ],
)
def test_a_warmup_as_long_as_the_run_is_named(scheduler, warmup, said):
    spec = TrainSpec(max_steps=30, warmup_steps=warmup, scheduler=scheduler)
    note = long_warmup(spec)
    assert note is not None
    assert f"train.warmup_steps ({warmup} steps) is not below train.max_steps (30 steps)" in note
    assert said in note, note
    assert lr_factor(29, spec) < 1.0  # what the note describes: the peak is never reached


def test_a_warmup_shorter_than_the_run_says_nothing():
    assert long_warmup(TrainSpec(max_steps=30, warmup_steps=29)) is None
    assert long_warmup(TrainSpec(max_steps=30, warmup_ratio=0.5)) is None
    assert long_warmup(TrainSpec(max_steps=30, scheduler="constant")) is None
    ratio = long_warmup(TrainSpec(max_steps=30, warmup_ratio=0.999), "stack 2's budget")
    assert ratio is not None and ratio.startswith("train.warmup_ratio (30 steps) is not below")
    assert "stack 2's budget (30 steps)" in ratio and "Lower train.warmup_ratio" in ratio


def test_a_run_shorter_than_its_warmup_says_so_once(tiny, capfd):
    train_from_config(tiny(train={"max_steps": 3, "warmup_steps": 5}), quiet=True)
    err = capfd.readouterr().err
    said = "train.warmup_steps (5 steps) is not below train.max_steps (3 steps)"
    assert err.count(said) == 1, err


@pytest.mark.parametrize(
    ("lr_schedule", "said"),
    [
        ("per_stage", ["stack 1's budget (2 steps)", "stack 2's budget (6 steps)"]),
        ("global", ["the steps planned over all stacks (8 steps)"]),
    ],
)
def test_a_progressive_run_names_the_steps_its_warmup_outlasts(tiny, capfd, lr_schedule, said):
    cfg = grown(
        tiny,
        growth={"schedule": "budget_share", "shares": [1, 3]},
        n_stacks=2,
        progressive={"lr_schedule": lr_schedule},
        train={"warmup_steps": 9},
    )
    train_from_config(with_train(cfg, max_steps=8), quiet=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if "is not below" in line]
    assert len(notes) == len(said) and all(s in n for s, n in zip(said, notes, strict=True))
