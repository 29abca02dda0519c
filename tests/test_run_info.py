"""Extensions see the run through RunInfo and act through Control; the Trainer knows none of
them by name (a custom extension can protect checkpoints, stop the run or ask for a save)."""

from __future__ import annotations

import json

import pytest
from test_checkpoints import make_trainer

from stackwise.train import Trainer
from stackwise.train.extensions import Extension
from stackwise.train.state import RunInfo, TrainState


class KeepFirst(Extension):
    """Protects the first checkpoint from rotation, stops after `stop_at`, and asks for a
    checkpoint at the first eval after step 0."""

    name = "keep_first"

    def __init__(self, stop_at: int) -> None:
        self.stop_at, self.first, self.seen = stop_at, None, []

    def on_save(self, run, path):
        self.first = self.first or path.name

    def protected_checkpoints(self):
        return {self.first} if self.first else set()

    def on_step_end(self, run):
        self.seen.append(type(run))
        if run.state.step == self.stop_at:
            run.control.should_stop = True

    def on_eval(self, run, metrics):
        if run.state.step == 2:
            run.control.should_save = True


def test_a_custom_extension_protects_stops_and_saves(tiny, tmp_path):
    every_step = {"save_steps": 1, "save_total_limit": 1, "save_best_model": False}
    cfg = tiny(train={"max_steps": 8, "eval_every": 2, **every_step})
    ext = KeepFirst(stop_at=5)
    trainer, _ = make_trainer(cfg, extensions=[ext])
    state = trainer.train()
    assert state.step == 5  # stopped by control.should_stop
    assert set(ext.seen) == {RunInfo}  # hooks never get the Trainer
    kept = sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*"))
    assert kept == ["checkpoint-1", "checkpoint-5"]  # the protected one survived rotation


def test_run_info_is_read_only_and_live(tiny):
    trainer, _ = make_trainer(tiny(train={"max_steps": 2}))
    run = trainer.run_info
    assert not isinstance(run, Trainer)
    with pytest.raises(AttributeError):
        run.state = TrainState()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        run.config = None  # type: ignore[misc]
    trainer.train()
    assert run.state.step == 2 and run.resumed_from is None


def test_state_dict_is_derived_from_train_state(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 2, "save_steps": 2, "save_best_model": True})
    trainer, _ = make_trainer(cfg)
    trainer.train()
    assert TrainState.from_dict(trainer.state_dict()) == trainer.state  # a lossless round trip
    saved = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())
    assert set(TrainState().state_dict()) <= set(saved) and saved["step"] == 2
    # the best-model extension's state goes to the checkpoint, its report to the metrics, and
    # trainer_state.json names the best value for readers (seed 001's step/epoch/best)
    best = saved["extensions"]["best_model"]["best"]
    assert best is not None and saved["best_metric"] == best
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("report/best_metric") is not None for r in rows)
