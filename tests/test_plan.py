"""The door: compile_plan resolves what a config leaves open, once, into frozen specs, and the
Plan's config.yaml (its source) always reloads to the run it describes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from stackwise.config import from_dict
from stackwise.plan import compile_plan
from stackwise.spec import Plan


def grown_plan(stacks: dict) -> Plan:
    """The plan of a two-stack diffusion growth over 64 rows, with per-stack `stacks`."""
    d = {
        "model": {"d_model": 16, "n_heads": 2, "n_stacks": 2, "blocks_per_stack": 1},
        "objective": {"name": "diffusion"},
        "progressive": {"strategy": "progressive", "steps_per_stack": 2, "stacks": stacks},
    }
    return compile_plan(from_dict(d), train_rows=64)


def test_a_plan_is_frozen_and_resolves_auto(tiny):
    plan = compile_plan(tiny(objective={"name": "diffusion"}, sample={"steps": 4}))
    assert isinstance(plan, Plan)
    assert plan.objective.causal is False and plan.sample.sampler == "ancestral"
    assert plan.parallel.name == "ddp" and not plan.parallel.chosen
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.model.d_model = 8  # type: ignore[misc]


def test_epochs_become_steps_in_the_spec_and_in_config_yaml(tiny):
    cfg = tiny(train={"num_train_epochs": 2.0, "max_steps": 600, "batch_size": 4})
    plan = compile_plan(cfg, train_rows=30, world_size=1)
    assert plan.train.max_steps == math.ceil(2.0 * 30 / 4) == 15
    saved = yaml.safe_load(plan.to_yaml())["train"]
    assert saved["max_steps"] == 15 and saved["num_train_epochs"] is None
    assert from_dict(yaml.safe_load(plan.to_yaml())).train.max_steps == 15


def test_a_stage_override_is_validated_like_the_config():
    plan = grown_plan({1: {"masking": {"antithetic": "false"}, "lr": 0.01}})
    first, second = plan.stages
    assert first.masking.antithetic is True
    assert second.masking.antithetic is False  # "false" read as the config reads it
    assert (first.lr, second.lr, first.steps, second.steps) == (2e-3, 0.01, 2, 2)
    assert second.seed != first.seed


def test_a_stage_plan_says_what_the_stage_trains(tmp_path):
    """A stage's config.yaml (its checkpoints') names the stage's own objective and masking,
    and reloads."""
    from stackwise.progressive.stage_specs import stage_plan

    plan = grown_plan({1: {"objective": {"name": "mlm"}, "masking": {"mask_ratio": 0.3}}})
    stage = stage_plan(plan, plan.stages[1], tmp_path / "stack_1")
    assert stage.objective.name == "mlm" and stage.masking.mask_ratio == 0.3
    again = from_dict(yaml.safe_load(stage.to_yaml()))
    assert again.objective.name == "mlm" and again.masking.mask_ratio == 0.3
    assert again.progressive.stacks == {} and again.train.max_steps == 2
    assert "causal" not in yaml.safe_load(stage.to_yaml())["objective"]  # resolved only


def test_with_section_keeps_resolved_fields_out_of_config_yaml(tiny):
    plan = compile_plan(tiny())
    changed = plan.with_section("objective", causal=False, weighting="elbo")
    assert changed.objective.causal is False
    assert "causal" not in changed.source["objective"]
    with pytest.raises(TypeError, match=r"no place in config\.yaml"):
        plan.with_section("train", output_dir=object())


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["clm", "mlm", "diffusion"]),
    steps=st.integers(1, 50),
    lr=st.floats(1e-5, 1.0),
    stacks=st.integers(1, 4),
    rows=st.integers(16, 400),
)
def test_every_plan_reloads_from_its_config_yaml(name, steps, lr, stacks, rows):
    d = {
        "model": {"d_model": 16, "n_heads": 2, "n_stacks": stacks, "blocks_per_stack": 1},
        "objective": {"name": name},
        "train": {"max_steps": steps, "lr": lr},
    }
    plan = compile_plan(from_dict(d), train_rows=rows)
    again = compile_plan(from_dict(yaml.safe_load(plan.to_yaml())), train_rows=rows)
    assert again == plan
