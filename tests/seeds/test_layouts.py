"""The seeds' layouts as a whole: every key a seed writes lands on a real config key, a config
written back in a seed's layout loads as the same config, the CLI lists every seed key, and each
seed's test file names its examples, each with a test and a line in docs/seeds/."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_origin

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from stackwise.config import Config, from_dict, load_config
from stackwise.config.aliases import LAYOUTS, SEED_KEYS
from stackwise.config.keys import section_of
from stackwise.config.seed_export import as_seed
from stackwise.errors import StackWiseError

ROOT = Path(__file__).parents[2]
PRESETS = sorted((ROOT / "stackwise" / "presets").glob("*.yaml"))
SEED_NUMBERS = [layout.seed for layout in LAYOUTS]


def _field(path: str) -> Any:
    model: Any = Config
    annotation = None
    for part in path.split("."):
        if model is None and get_origin(annotation) is dict:
            return annotation  # an entry of a free-form mapping (train.strategy_options)
        assert model is not None and part in model.model_fields, path
        annotation = model.model_fields[part].annotation
        model = section_of(annotation)
    return annotation


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.seed)
def test_every_seed_key_lands_on_a_real_key(layout):
    for key in layout.keys.values():
        _field(key.target)  # an assertion naming the target when it is no config key


@pytest.mark.parametrize("seed", SEED_NUMBERS)
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_a_config_written_in_a_seed_layout_loads_as_itself(seed, preset):
    config = load_config(preset)
    text = yaml.safe_dump(as_seed(config, seed))
    assert from_dict(yaml.safe_load(text)) == config


def test_config_show_lists_every_seed_key_and_writes_a_layout(tmp_path):
    run = [sys.executable, "-m", "stackwise", "config", "show"]
    listed = subprocess.run([*run, "--aliases"], capture_output=True, text=True, check=True)
    for path in SEED_KEYS:
        assert f"  {path} " in listed.stdout, path
    shown = subprocess.run(
        [*run, "tiny-clm", "--as-seed", "001"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.startswith("# seed 001 layout")
    (tmp_path / "seed.yaml").write_text(shown.stdout)
    assert load_config(tmp_path / "seed.yaml") == load_config("stackwise/presets/tiny-clm.yaml")
    bad = subprocess.run([*run, "--as-seed", "7"], capture_output=True, text=True)
    assert bad.returncode == 2 and "000, 001, 002, 003, 004" in bad.stderr
    assert "Traceback" not in bad.stderr


seed_values = st.one_of(
    st.booleans(), st.integers(-3, 5000), st.floats(allow_nan=False), st.text(max_size=8),
    st.none(), st.lists(st.integers(0, 3), max_size=3),
)  # fmt: skip


@settings(deadline=None, max_examples=60)
@given(st.dictionaries(st.sampled_from(sorted(SEED_KEYS)), seed_values, max_size=6))
def test_any_seed_keys_give_a_config_or_a_stackwise_error(given_keys):
    data: dict[str, Any] = {}
    for path, value in given_keys.items():
        *where, leaf = path.split(".")
        node = data
        for part in where:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return
        node[leaf] = value
    try:
        config = from_dict(data)
    except StackWiseError as err:  # refused: one paragraph naming the problem
        message = str(err)
        assert message.strip() and "\n" not in message and "Traceback" not in message
    else:
        assert isinstance(config, Config)


@pytest.mark.parametrize("seed", SEED_NUMBERS)
def test_each_seed_example_has_a_test_and_a_doc_line(seed):
    module = importlib.import_module(f"test_seed_{seed}")
    ids = [example_id for example_id, _ in module.EXAMPLES]
    assert ids and len(ids) == len(set(ids)), seed
    doc = (ROOT / "docs" / "seeds" / f"seed_{seed}.md").read_text()
    for example_id in ids:
        assert callable(getattr(module, f"test_{example_id}", None)), example_id
        assert re.search(rf"\b{re.escape(example_id)}\b", doc), example_id
    index = (ROOT / "docs" / "seeds.md").read_text()
    assert f"seeds/seed_{seed}.md" in index


LEGACY = (
    "quantization_enabled", "quantization_type", "backbone_quantized", "adapters_full_precision",
    "mixed_precision", "new_stack_precision", "qlora_enabled", "use_lora", "qlora_rank",
    "lora_r", "qlora_alpha", "lora_alpha", "lora_dropout", "qlora_strategy",
    "qlora_rank_pattern", "qlora_alpha_pattern", "qlora_configs", "progressive_qlora",
    "progressive_qlora_rank", "progressive_qlora_alpha", "lora_lr", "memory_lr",
    "base_model_lr", "enabled_extensions", "eval_steps", "log_to_wandb",
)  # fmt: skip


@pytest.mark.parametrize("where", ["", "progressive.", "train."])
def test_names_accepted_before_the_seed_layouts_still_are(where):
    """Configs written for earlier releases keep loading: each legacy flat name, at the top
    level or inside progressive: / train:, still lands on its key."""
    for name in LEGACY:
        path = f"{where}{name}"
        assert path in SEED_KEYS or path == SEED_KEYS[name].target, path
    config = from_dict({"train": {"log_to_wandb": True, "eval_steps": 7}})
    assert config.logging.log_to_wandb and config.train.eval_every == 7


@pytest.mark.parametrize("path", sorted(SEED_KEYS))
def test_a_seed_key_means_the_same_as_an_override_and_in_a_file(path, tmp_path):
    """`key=value` on the command line gives the config the same key in a file gives."""
    from stackwise.config.loading import load_config as load

    samples = {
        "training.progressive.training_objective": "mlm",
        "mixed_precision": True,
        "fp16": True,
        "training.progressive.enabled": True,
        "training.max_length": 32,
    }
    if path not in samples:
        return
    value = samples[path]
    *where, leaf = path.split(".")
    data: dict[str, Any] = {}
    node = data
    for part in where:
        node = node.setdefault(part, {})
    node[leaf] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    from_file = load(tmp_path / "c.yaml")
    from_override = load(
        None, [f"{path}={yaml.safe_dump(value).strip().removesuffix('...').strip()}"]
    )
    assert from_override == from_file


def test_an_invalid_seed_file_names_its_keys_as_the_file_wrote_them(tmp_path):
    """The rules speak our keys (eval_every, data.seq_len); for a config in a seed's names the
    error also says which of its keys each one is, before its closing advice: from a file, a
    seed's keyword arguments, seed 004's flat file; not for a key an override replaced, nor
    for a key that only starts like one named (lora.rank inside lora.rank_pattern)."""
    best = {"max_steps": 20, "save_best_model": True}
    seed = tmp_path / "seed.yaml"
    seed.write_text(yaml.safe_dump({"training": {**best, "eval_steps": 500, "max_length": 4096}}))
    with pytest.raises(StackWiseError) as caught:
        load_config(seed)
    said = str(caught.value)
    assert "eval_every (500) exceeds max_steps" in said, said
    assert "As the config wrote them: " in said and said.endswith(". Fix the value and rerun.")
    assert "train.eval_every is 'training.eval_steps'" in said
    assert "data.seq_len is 'training.max_length'" in said
    # an override of ours replaced the file's eval_steps: the error is the override's
    with pytest.raises(StackWiseError) as caught:
        load_config(seed, ["train.eval_every=400"])
    assert "eval_every (400)" in str(caught.value)
    assert "'training.eval_steps'" not in str(caught.value)
    with pytest.raises(StackWiseError, match=re.escape("train.eval_every is 'training.eval")):
        from_dict({"training": {**best, "eval_steps": 500}})
    with pytest.raises(StackWiseError) as caught:  # our names: nothing to add
        from_dict({"train": {**best, "eval_every": 500}, "data": {"seq_len": 4096}})
    assert "eval_every (500)" in str(caught.value) and "wrote them" not in str(caught.value)
    with pytest.raises(StackWiseError) as caught:
        from_dict({"qlora_rank": 8, "lora": {"enabled": True, "rank_pattern": "nonsense"}})
    assert "rank_pattern" in str(caught.value) and "qlora_rank" not in str(caught.value)


def test_seed_004s_flat_file_names_its_keys_in_the_error(tmp_path):
    from stackwise.fronts.finetune_flags import finetune_config

    flat = tmp_path / "default.json"
    flat.write_text('{"model_name_or_path": "m", "learning_rate": -1, "eval_steps": 0}')
    with pytest.raises(StackWiseError) as caught:
        finetune_config(["--config", str(flat)])
    said = str(caught.value)
    assert "train.lr is 'learning_rate'; train.eval_every is 'eval_steps'" in said, said
    with pytest.raises(StackWiseError) as caught:  # the flag replaced the file's value
        finetune_config(["--config", str(flat), "--learning_rate", "-2"])
    assert "'learning_rate'" not in str(caught.value)


def test_seed_names_find_a_key_at_a_sentences_end_and_never_inside_another():
    from stackwise.config.aliases import in_seed_names

    tail = " Fix the value and rerun."
    said = in_seed_names("shorten data.seq_len." + tail, {"data.seq_len": "training.max_length"})
    assert said == (
        "shorten data.seq_len. As the config wrote them: data.seq_len is "
        "'training.max_length'." + tail
    )
    assert in_seed_names("bad lora.rank_pattern." + tail, {"lora.rank": "qlora_rank"}) == (
        "bad lora.rank_pattern." + tail
    )
    # a spelling the message shows already (a flag retold beside its key) is not repeated
    shown = "--learning_rate (train.lr): bad." + tail
    assert in_seed_names(shown, {"train.lr": "--learning_rate"}) == shown


def test_seed_004s_module_names_the_flags_in_its_errors(capsys):
    from stackwise.fronts.model_trainer import main

    assert main(["--model_name_or_path", "m", "--learning_rate", "-1"]) == 2
    assert "--learning_rate (train.lr)" in capsys.readouterr().err
