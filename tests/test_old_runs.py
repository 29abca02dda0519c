"""Runs written by main before the redesign of issue 29 (commit 9ec99c4, tests/fixtures) still
load, compute what they computed, and resume: saved configs go through the door, old stack
metadata (adapters as [rank, alpha, dtype] lists) is still read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stackwise.config import load_config
from stackwise.pipeline import train_from_config
from stackwise.runs import load_trained

OLD = Path(__file__).parent / "fixtures" / "main-9ec99c4"


@pytest.fixture
def old_runs(tmp_path, monkeypatch) -> Path:
    """A copy of the old runs (a resume writes into its run) with its relative corpus path."""
    shutil.copytree(OLD, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    return tmp_path / "old"


@pytest.mark.parametrize("kind", ["clm", "prog"])
def test_an_old_run_loads_and_computes_what_it_computed(old_runs, kind):
    expected = load_file(str(old_runs / "expected_logits.safetensors"))
    plan, rack, tok = load_trained(old_runs / f"run-{kind}")
    assert plan.model.d_model == 16 and len(tok) == 300
    rack.eval()
    t = torch.tensor([0.5, 0.5]) if getattr(rack, "uses_time", False) else None
    with torch.no_grad():
        got = rack(expected["ids"], None, t) if t is not None else rack(expected["ids"])
    assert torch.allclose(got.float(), expected[kind], atol=1e-5), kind


def test_an_old_qlora_stack_keeps_its_adapters(old_runs):
    from stackwise.quant.lora import adapter_names

    _, rack, _ = load_trained(old_runs / "run-prog")
    assert {"stack", "trunk"} <= adapter_names(rack.stacks[0])


def test_an_old_checkpoint_resumes(old_runs, tmp_path):
    run = old_runs / "run-clm"
    overrides = [
        "train.max_steps=6",
        "train.output_dir=run-clm-more",  # a finished run is resumed into a new folder
        f"train.resume_from_checkpoint={run / 'checkpoint-4'}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    config = load_config(run / "config.yaml", overrides)
    result = train_from_config(config, quiet=True)
    assert result.state.step == 6
    assert result.state.resumed_from is not None
    assert Path(result.state.resumed_from).name == "checkpoint-4"
    assert [h["step"] for h in result.state.history][:2] == [0, 2]  # the old history, kept
