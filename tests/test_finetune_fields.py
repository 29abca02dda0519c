"""Every Hugging Face and instruction-data field changes a fine-tuning run or is refused."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import torch
from hf_fixtures import chat_file, tiny_hf
from test_fields_read import merge, set_path

from stackwise.config import from_dict
from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config

Q4 = {"model": {"load_in_4bit": True}}
# field -> (value, context). Values "EVAL_FILE" and "TEMPLATE" are filled in by the fixture.
HF_FIELDS: dict[str, tuple[Any, dict]] = {
    "model.dtype": ("bf16", {}),
    "model.load_in_4bit": (True, {}),
    "model.load_in_8bit": (True, {}),
    "model.quant_type_4bit": ("fp4", Q4),
    "model.double_quant": (False, Q4),
    "model.compute_dtype": ("bf16", Q4),
    "model.quant_storage": ("bf16", Q4),
    "data.chat_format": ("text", {}),  # messages rows have no 'text' field: refused
    "data.chat_template": ("TEMPLATE", {}),
    "data.train_on": ("all", {}),
    "data.train_on_eos": ("none", {}),
    "data.drop_unsupervised": (True, {"data": {"files": ["WITH_UNSUPERVISED"]}}),
    "data.packing": (True, {}),
    "data.padding_free": (False, {}),
    "data.eval_files": ("EVAL_FILE", {}),
    "data.dataset_name": ("nobody/nothing", {}),  # beside data.files: refused
    "data.dataset_subset": ("x", {}),
    "data.dataset_split": ("test", {}),
    "train.group_lr.base": (1e-4, {"lora": {"modules_to_save": ["lm_head"]}}),
    "lora.target_modules": (["q_proj"], {}),
    "lora.use_dora": (True, {}),
    "lora.use_rslora": (True, {}),
    "lora.init_lora_weights": ("gaussian", {}),
    "lora.loraplus_lr_ratio": (8.0, {}),
    "lora.modules_to_save": (["lm_head"], {}),
    "lora.save_merged": (True, {}),
    "model.source": ("rack", {}),  # with model_name_or_path: refused
    "model.model_name_or_path": ("SECOND_MODEL", {}),
    "data.mode": ("pretraining", {}),
}
# the fields whose value above is refused, and the words of their refusal; every other field
# must train (a load failure does not count as a change)
REFUSED = {
    "data.chat_format": "has no field 'text'",
    "data.dataset_name": "exactly one of",
    "data.dataset_subset": "only apply with data.dataset_name",
    "data.dataset_split": "only apply with data.dataset_name",
    "model.source": "only applies to Hugging Face",
    "data.mode": "trains on data.mode: instruction",
}
# tested one by one below
HF_CUSTOM = {
    "model.attn_implementation",
    "model.trust_remote_code",
    "data.dataset_dir",
    "train.num_train_epochs",
}
TEMPLATE = (
    "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hffields")
    unsupervised = chat_file(root / "u.jsonl", n=20, seed=3)
    with unsupervised.open("a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "no reply"}]}) + "\n")
    return {
        "root": root,
        "model": tiny_hf(root / "m"),
        "second": tiny_hf(root / "m2", kind="qwen2"),
        "chat": chat_file(root / "c.jsonl", n=20),
        "eval": chat_file(root / "e.jsonl", n=6, seed=9),
        "unsupervised": unsupervised,
        "n": [0],
    }


def base_dict(world: dict) -> dict:
    return {
        "model": {"source": "hf", "model_name_or_path": str(world["model"])},
        "data": {"mode": "instruction", "files": [str(world["chat"])], "seq_len": 128},
        "lora": {"enabled": True, "rank": 4, "alpha": 8.0},
        "train": {
            "max_steps": 2,
            "batch_size": 4,
            "lr": 1e-2,
            "eval_every": 2,
            "eval_batches": 1,
            "mixed_precision": "no",
        },
        "logging": {"tensorboard": False, "console": False, "progress_bar": "never"},
        "sample": {"num_samples": 0},
    }


def fingerprint(world: dict, data: dict) -> Any:
    world["n"][0] += 1
    out = world["root"] / f"run{world['n'][0]}"
    data = set_path(data, "train.output_dir", str(out))
    try:
        res = train_from_config(from_dict(data), quiet=True)
    except StackWiseError as err:
        return ("refused", str(err)[:200])
    digest = hashlib.sha256()
    for k, v in sorted(res.rack.state_dict().items()):
        if v.is_floating_point():
            digest.update(k.encode())
            digest.update(v.float().numpy().tobytes())
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return {
        "weights": digest.hexdigest(),
        "history": res.state.history,
        "files": files,
        "data": res.data.describe,
    }


FILLS = {"EVAL_FILE": "eval", "SECOND_MODEL": "second", "WITH_UNSUPERVISED": "unsupervised"}


def fill(value: Any, world: dict) -> Any:
    if value == "TEMPLATE":
        return TEMPLATE
    if isinstance(value, str) and value in FILLS:
        return [str(world[FILLS[value]])] if value != "SECOND_MODEL" else str(world["second"])
    if isinstance(value, list):
        return [str(world[FILLS[v]]) if v in FILLS else v for v in value]
    return value


@pytest.mark.parametrize("field", sorted(HF_FIELDS))
def test_hf_field_changes_the_run_or_is_refused(field, world):
    value, context = HF_FIELDS[field]
    context = {s: {k: fill(v, world) for k, v in vals.items()} for s, vals in context.items()}
    base = merge(base_dict(world), context)
    before = fingerprint(world, base)
    after = fingerprint(world, set_path(base, field, fill(value, world)))
    assert after != before, f"{field}={value!r} changed nothing"
    if field == "data.drop_unsupervised":  # the base run is the one refused here
        assert before[0] == "refused" and isinstance(after, dict)
    elif field in REFUSED:
        assert after[0] == "refused" and REFUSED[field] in after[1], after
    else:
        assert isinstance(after, dict), after


def test_table_covers_every_new_field():
    from test_fields_read import CUSTOM

    assert set(HF_FIELDS) | HF_CUSTOM <= CUSTOM | {"data.mode"}


def test_attention_implementation_and_remote_code_reach_transformers(world, monkeypatch):
    from transformers import AutoModelForCausalLM

    seen: list[dict] = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(path, **kwargs):
        seen.append(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    data = merge(
        base_dict(world),
        {
            "model": {"attn_implementation": "eager", "trust_remote_code": True},
            "train": {"max_steps": 1, "eval_every": 1},
        },
    )
    res = train_from_config(
        from_dict(set_path(data, "train.output_dir", str(world["root"] / "attn"))), quiet=True
    )
    assert seen[0]["attn_implementation"] == "eager" and seen[0]["trust_remote_code"] is True
    assert res.rack.config._attn_implementation == "eager"
    assert from_dict(base_dict(world)).model.trust_remote_code is False


def test_a_saved_datasets_dir_trains_like_the_file(world):
    import datasets

    rows = [json.loads(line) for line in world["chat"].read_text().splitlines()]
    folder = world["root"] / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    runs = []
    for source in ({"files": [str(world["chat"])]}, {"dataset_dir": str(folder)}):
        data = base_dict(world)
        data["data"] = {k: v for k, v in data["data"].items() if k != "files"} | source
        runs.append(fingerprint(world, data))
    assert runs[0]["weights"] == runs[1]["weights"] and runs[0]["history"] == runs[1]["history"]


def test_epochs_set_the_step_budget(world):
    data = base_dict(world)
    data["train"] = {k: v for k, v in data["train"].items() if k != "max_steps"} | {
        "num_train_epochs": 2.0,
        "eval_every": 100,
    }
    res = train_from_config(
        from_dict(set_path(data, "train.output_dir", str(world["root"] / "ep"))), quiet=True
    )
    n_rows = len(res.data.train)
    assert res.state.step == -(-2 * n_rows // 4)  # ceil(2 epochs x rows / batch 4)
    assert res.config.train.max_steps == res.state.step
    with pytest.raises(StackWiseError, match="remove one of them"):
        from_dict(set_path(base_dict(world), "train.num_train_epochs", 1.0))


def test_flash_attention_without_its_package_is_a_clear_error(world):
    """flash_attention_2 runs where flash-attn is installed (a CUDA machine); elsewhere the run
    stops at load with what to install or pick instead."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available():
        pytest.skip("flash-attn is installed here: the option runs")
    data = merge(base_dict(world), {"model": {"attn_implementation": "flash_attention_2"}})
    out = world["root"] / "flash"
    with pytest.raises(StackWiseError, match="attn_implementation: sdpa"):
        train_from_config(from_dict(set_path(data, "train.output_dir", str(out))), quiet=True)
