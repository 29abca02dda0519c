"""parallel.strategy: deepspeed and its JSON file (the seeds' --deepspeed_config): what is
read, what must agree with train.*, and what is refused in one paragraph. No process is
launched here (tests/test_deepspeed.py trains)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stackwise.config import rules_deepspeed
from stackwise.config.deepspeed_file import build, conflicts
from stackwise.config.loading import InvalidConfig, from_dict
from stackwise.plan_parallel import parallel_spec


def refused(section: dict) -> str:
    with pytest.raises(InvalidConfig) as err:
        from_dict(section)
    said = str(err.value)
    assert "\n" not in said
    return said


@pytest.fixture
def installed(monkeypatch):
    """DeepSpeed present for the config's checks, whether or not this machine has it."""
    monkeypatch.setattr(rules_deepspeed, "find_spec", lambda name: object())


def ds_file(tmp_path, data) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_a_missing_extra_is_refused_with_the_install_line(monkeypatch):
    monkeypatch.setattr(rules_deepspeed, "find_spec", lambda name: None)
    said = refused({"parallel": {"strategy": "deepspeed"}})
    assert "pip install --no-build-isolation 'stackwise[deepspeed]'" in said
    assert "parallel.strategy: fsdp" in said  # what runs without it


def test_the_file_alone_asks_for_deepspeed_and_fills_in_train(installed, tmp_path):
    path = ds_file(
        tmp_path,
        {
            "zero_optimization": {"stage": 2, "overlap_comm": True},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": 2,
            "bf16": {"enabled": "auto"},
            "communication_data_type": "fp32",
        },
    )
    config = from_dict({"parallel": {"deepspeed_config": path}, "train": {"grad_accum_steps": 2}})
    spec = parallel_spec(config, None)
    ds = spec.deepspeed
    assert spec.name == "deepspeed" and spec.shards
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert ds["train_micro_batch_size_per_gpu"] == config.train.batch_size
    assert ds["gradient_accumulation_steps"] == 2 and ds["communication_data_type"] == "fp32"
    assert "bf16" not in ds and "train_batch_size" not in ds  # autocast; derived by DeepSpeed


def test_sharding_and_offload_set_the_zero_stage(installed):
    config = from_dict(
        {"parallel": {"strategy": "deepspeed", "sharding": "full_shard", "cpu_offload": True}}
    )
    zero = parallel_spec(config, None).deepspeed["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu"} == zero["offload_param"]
    plain = from_dict({"parallel": {"strategy": "deepspeed"}})
    assert parallel_spec(plain, None).deepspeed["zero_optimization"] == {"stage": 3}


@pytest.mark.parametrize(
    ("data", "section", "said"),
    [
        ({"train_micro_batch_size_per_gpu": 3}, {}, 'set it to "auto"'),
        ({"gradient_clipping": 0.5}, {}, "train.max_grad_norm is 1.0"),
        ({"optimizer": {"type": "AdamW"}}, {}, "remove the section"),
        ({"scheduler": {"type": "WarmupLR"}}, {}, "builds the scheduler"),
        ({"fp16": {"enabled": True}}, {}, "use train.mixed_precision: bf16"),
        ({"bf16": {"enabled": True}}, {}, "choose with train.mixed_precision"),
        (
            {"zero_optimization": {"stage": 2}},
            {"parallel": {"sharding": "full_shard"}},
            "keep one of the two",
        ),
        ("{not json", {}, "cannot be read"),
        ([1, 2], {}, "holds no JSON object"),
    ],
    ids=["micro", "clip", "optimizer", "scheduler", "fp16", "bf16", "stage", "json", "list"],
)
def test_a_file_that_disagrees_is_refused(installed, tmp_path, data, section, said):
    path = ds_file(tmp_path, data)
    text = refused(
        {**section, "parallel": {**section.get("parallel", {}), "deepspeed_config": path}}
    )
    assert said in text, text


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"parallel": {"deepspeed_config": "x.json", "strategy": "ddp"}}, "parallel.strategy"),
        ({"parallel": {"deepspeed_config": "nowhere.json"}}, "does not exist"),
        ({"parallel": {"strategy": "deepspeed", "param_dtype": "bf16"}}, "is FSDP's"),
        ({"parallel": {"strategy": "deepspeed", "sharding": "hybrid_shard"}}, "hybrid_shard"),
        (
            {"parallel": {"strategy": "deepspeed"}, "progressive": {"strategy": "progressive"}},
            "progressive growth does not run under DeepSpeed",
        ),
        (
            {"parallel": {"strategy": "deepspeed"}, "quant": {"enabled": True}},
            "a quantized rack (quant.enabled)",
        ),
        (
            {"parallel": {"strategy": "deepspeed", "sharding": "no_shard", "cpu_offload": True}},
            "partitions nothing",
        ),
        (
            {"parallel": {"strategy": "deepspeed"}, "train": {"skip_nonfinite_steps": True}},
            "cannot skip a DeepSpeed step",
        ),
        (
            {"parallel": {"strategy": "deepspeed"}, "train": {"mixed_precision": "fp16"}},
            "use bf16",
        ),
    ],
    ids=[
        "strategy",
        "missing",
        "fsdp-key",
        "hybrid",
        "progressive",
        "quant",
        "offload0",
        "skip",
        "fp16",
    ],
)
def test_what_deepspeed_does_not_run_is_refused(installed, section, said):
    assert said in refused(section)


@settings(max_examples=60, deadline=None)
@given(
    micro=st.sampled_from([None, "auto", 4, 5]),
    accum=st.sampled_from([None, "auto", 1, 3]),
    clip=st.sampled_from([None, "auto", 1.0, 0.0]),
)
def test_owned_keys_pass_exactly_when_absent_auto_or_equal(micro, accum, clip):
    """train.batch_size 4, grad_accum_steps 1, max_grad_norm 1.0: a file value passes when
    it is absent, "auto" or ours, and every other is named; the built config carries ours."""

    class Train:
        batch_size, grad_accum_steps, max_grad_norm, mixed_precision = 4, 1, 1.0, "no"

    data = {
        k: v
        for k, v in (
            ("train_micro_batch_size_per_gpu", micro),
            ("gradient_accumulation_steps", accum),
            ("gradient_clipping", clip),
        )
        if v is not None
    }
    found = list(conflicts(data, Train, None))
    wrong = [k for k, v in data.items() if v not in ("auto", 4 if "micro" in k else 1, 1.0)]
    wrong = [k for k in wrong if not (k == "gradient_clipping" and data[k] == 1.0)]
    assert len(found) == len(wrong) and all(any(k in f for f in found) for k in wrong)
    made = build(data, Train, None, False)
    assert (made["train_micro_batch_size_per_gpu"], made["gradient_accumulation_steps"]) == (4, 1)
    assert made["gradient_clipping"] == 1.0
