"""`stackwise lr-find`: an exponential LR sweep that suggests an LR, plots, and restores."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from stackwise.cli import main
from stackwise.errors import StackWiseError
from stackwise.pipeline import trainer_of as build_trainer
from stackwise.train.lr_find import lr_find, suggest


def test_lr_find_sweeps_suggests_and_restores_the_model(tiny):
    trainer = build_trainer(tiny(train={"lr": 1e-3}))
    before = {k: v.clone() for k, v in trainer.unwrapped().state_dict().items()}
    lrs_before = [g["lr"] for g in trainer.optimizer.param_groups]
    result = lr_find(trainer, 1e-5, 10.0, steps=40)
    assert 2 <= len(result.lrs) <= 40 and result.lrs[0] == 1e-5
    assert all(b > a for a, b in zip(result.lrs, result.lrs[1:], strict=False))  # exponential
    assert 1e-5 <= result.suggestion <= result.lrs[-1]
    after = trainer.unwrapped().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == lrs_before
    assert not trainer.optimizer.state_dict()["state"]  # no Adam moments left behind


def test_a_placement_that_steps_itself_is_refused_before_the_sweep(tiny):
    """DeepSpeed's engine steps itself; the command refuses its config before building
    anything (tests/test_structure.py), and lr_find refuses such a trainer handed to it."""
    trainer = build_trainer(tiny(train={"lr": 1e-3}))
    before = {k: v.clone() for k, v in trainer.unwrapped().state_dict().items()}
    trainer.placement.parallelizer.steps_itself = True  # what the deepspeed parallelizer says
    with pytest.raises(StackWiseError, match="ddp or fsdp"):
        lr_find(trainer, 1e-5, 10.0, steps=5)
    after = trainer.unwrapped().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_suggestion_is_the_steepest_descent():
    lrs = [10.0**e for e in range(-6, 1)]
    losses = [5.0, 4.95, 4.9, 3.0, 1.5, 1.4, 9.0]  # falls fastest around 1e-3
    assert suggest(lrs, losses) == 1e-3


def test_lr_find_cli_prints_a_suggestion_and_writes_a_png(tiny, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny().model_dump(mode="json")))
    plot = tmp_path / "lr.png"
    assert main(["lr-find", str(config), "--steps", "30", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    found = re.search(r"suggested lr: ([0-9.e+-]+)", out)
    assert found and 1e-6 <= float(found.group(1)) <= 1.0, out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["lr-find", str(config), "--min-lr", "1", "--max-lr", "0.1"]) == 2


def test_lr_find_makes_the_plot_folder_takes_overrides_after_flags_and_warns(
    tiny, tmp_path, capsys
):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny().model_dump(mode="json")))
    plot = tmp_path / "new" / "nested" / "lr.png"
    out_dir = tmp_path / "sweep"
    assert main(["lr-find", str(config), "--steps", "3", f"train.output_dir={out_dir}"]) == 0
    assert (out_dir / "lr_find.png").is_file()  # the override after the flags was applied
    assert "stackwise: warning: the sweep ran 3 steps, too few" in capsys.readouterr().err
    assert main(["lr-find", str(config), "--steps", "3", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "run").exists()  # its output dir held only a lock: removed
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    bad = ["lr-find", str(config), "--steps", "3", "--plot", str(blocker / "lr.png")]
    assert main(bad) == 2  # refused before the sweep, not after it
    assert "Cannot create the folder of --plot" in capsys.readouterr().err


def test_a_suggestion_at_the_start_of_the_sweep_is_flagged():
    from stackwise.train.lr_find import LRFindResult

    lrs = [10.0**e for e in range(-6, 1)]
    falling_first = LRFindResult(lrs, [5.0, 1.0, 0.9, 0.8, 0.7, 0.6, 9.0], 1e-6, False)
    assert "very start of the sweep" in falling_first.warnings()[0]
    assert not LRFindResult(lrs, [], 1e-3, False).warnings()
