"""The parallel section: its names (ours, earlier ones, the seeds'), what an `accelerate
launch --use_fsdp` asks for, and what FSDP refuses rather than ignores. No process is
launched here (tests/test_fsdp.py trains)."""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import stackwise
from stackwise.config import load_config
from stackwise.config.loading import InvalidConfig, from_dict
from stackwise.errors import StackWiseError
from stackwise.launcher import forget_launch, hide_fsdp_launch

SHARDINGS = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")


@pytest.fixture
def launched(monkeypatch):
    """Sets the environment of an `accelerate launch --use_fsdp`; read afresh each test."""

    def set_env(**env: str) -> None:
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        forget_launch()

    yield set_env
    forget_launch()


def test_earlier_and_seed_names_land_in_the_parallel_section():
    old = from_dict({"train": {"parallelizer": "fsdp", "fsdp_sharding_strategy": "NO_SHARD"}})
    assert (old.parallel.strategy, old.parallel.sharding) == ("fsdp", "no_shard")
    seed = from_dict(
        {"training": {"distributed_strategy": "fsdp", "fsdp_sharding_strategy": "HYBRID_SHARD"}}
    )
    assert (seed.parallel.strategy, seed.parallel.sharding) == ("fsdp", "hybrid_shard")
    assert seed.training.fsdp_sharding_strategy == "hybrid_shard"


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=14))
def test_a_sharding_name_is_one_of_four(name):
    if name in SHARDINGS:
        assert from_dict({"parallel": {"sharding": name}}).parallel.sharding == name
        return
    with pytest.raises(InvalidConfig) as err:
        from_dict({"parallel": {"strategy": "fsdp", "sharding": name}})
    assert "parallel.sharding" in str(err.value) and "full_shard" in str(err.value)


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"parallel": {"cpu_offload": True}}, "applies to sharded training only"),
        ({"parallel": {"param_dtype": "bf16"}}, "applies to sharded training only"),
        (
            {"parallel": {"strategy": "fsdp", "shard_group_size": 2}},
            "set parallel.sharding: hybrid_shard",
        ),
        (
            {
                "parallel": {"strategy": "fsdp"},
                "model": {"model_name_or_path": "base", "load_in_8bit": True},
            },
            "model.load_in_8bit does not run under FSDP",
        ),
        (
            {
                "parallel": {"strategy": "fsdp", "param_dtype": "bf16"},
                "model": {"model_name_or_path": "b", "load_in_4bit": True, "quant_storage": "fp32"},
            },
            "corrupt them. Set model.quant_storage: uint8",
        ),
        (
            {
                "parallel": {"strategy": "fsdp", "cpu_offload": True},
                "quant": {"enabled": True},
                "lora": {"enabled": True},
            },
            "cannot hold integer-coded weights",
        ),
        (
            {"parallel": {"strategy": "fsdp"}, "train": {"consolidated_weights": True}},
            "Remove train.consolidated_weights",
        ),
    ],
    ids=["offload", "dtype", "group", "8bit", "storage", "offload-4bit", "consolidated"],
)
def test_what_fsdp_cannot_do_is_refused_in_one_paragraph(section, said):
    with pytest.raises(InvalidConfig) as err:
        from_dict(section)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_local_losses_keep_their_unwrapped_model(tiny):
    config = tiny(model={"n_stacks": 2}, parallel={"strategy": "fsdp"})
    config.progressive.end_to_end_scope = "stackwise"
    with pytest.raises(StackWiseError, match="places its model with 'manual'"):
        stackwise.train_from_config(config, quiet=True)


def test_an_fsdp_launch_makes_the_run_shard(launched):
    launched(
        FSDP_SHARDING_STRATEGY="2",
        FSDP_OFFLOAD_PARAMS="true",
        FSDP_ACTIVATION_CHECKPOINTING="true",
    )
    plan = stackwise.compile_plan(load_config(None, ["objective.name=clm"]))
    assert plan.parallel.name == "fsdp" and plan.parallel.shards
    assert plan.parallel.sharding == "shard_grad_op" and plan.parallel.cpu_offload
    assert plan.model.gradient_checkpointing  # FSDP's activation checkpointing, per block
    # config.yaml says so: a later process (generate, a resume) has no launch to read
    saved = yaml.safe_load(plan.to_yaml())
    assert saved["parallel"]["strategy"] == "fsdp" and saved["parallel"]["cpu_offload"]
    assert saved["model"]["gradient_checkpointing"] is True
    hide_fsdp_launch()  # what building the Accelerator does: it never sees the request
    assert not any(k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP" for k in os.environ)
    assert stackwise.compile_plan(load_config(None, [])).parallel.name == "fsdp"  # remembered


@pytest.mark.parametrize(
    ("sharding", "reshard", "want"),
    [
        ("FULL_SHARD", "true", "full_shard"),  # accelerate's defaults
        ("FULL_SHARD", "false", "shard_grad_op"),  # --fsdp_reshard_after_forward false
        ("FULL_SHARD", "SHARD_GRAD_OP", "shard_grad_op"),  # FSDP1's spelling there
        ("SHARD_GRAD_OP", "true", "shard_grad_op"),  # --fsdp_sharding_strategy
        ("HYBRID_SHARD", "true", "hybrid_shard"),
        ("3", "true", "no_shard"),  # the numeric form
    ],
)
def test_a_launch_sharding_is_read_from_both_variables(launched, sharding, reshard, want):
    launched(FSDP_SHARDING_STRATEGY=sharding, FSDP_RESHARD_AFTER_FORWARD=reshard)
    assert stackwise.compile_plan(load_config(None, [])).parallel.sharding == want


def test_a_sharded_run_records_the_sharding_it_uses():
    """parallel.sharding left unset means full_shard, and config.yaml says so."""
    plan = stackwise.compile_plan(load_config(None, ["parallel.strategy=fsdp"]))
    assert plan.parallel.sharding == "full_shard"
    assert yaml.safe_load(plan.to_yaml())["parallel"]["sharding"] == "full_shard"


def test_an_fsdp_launch_of_a_ddp_config_is_refused(launched):
    launched()
    with pytest.raises(StackWiseError, match="launched for FSDP"):
        stackwise.compile_plan(load_config(None, ["parallel.strategy=ddp"]))


def test_an_unknown_launch_sharding_is_refused(launched):
    launched(FSDP_SHARDING_STRATEGY="HYBRID_SHARD_ZERO2")
    with pytest.raises(StackWiseError, match="HYBRID_SHARD_ZERO2"):
        stackwise.compile_plan(load_config(None, []))


def test_one_process_says_the_shard_dtypes_change_nothing(tiny, capsys):
    """fsdp on one process (no offload) trains the model whole: a gather dtype is noted."""
    config = tiny(parallel={"strategy": "fsdp", "param_dtype": "bf16"})
    result = stackwise.train_from_config(config, quiet=True)
    assert result.state.step == 4
    assert "parallel.param_dtype: bf16 changes nothing here" in capsys.readouterr().err
