"""The config loader: files, overrides, round trips and every kind of mistake."""

from __future__ import annotations

import contextlib
import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stackwise.cli.common import PRESETS
from stackwise.config import Config, ModelConfig, from_dict, load_config, parse_override
from stackwise.errors import StackWiseError


def test_defaults_are_valid_and_readable_from_yaml_and_json(tmp_path):
    data = {"model": {"d_model": 64, "n_heads": 4}, "train": {"lr": 1e-3}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "c.json").write_text(json.dumps(data))
    a, b = load_config(tmp_path / "c.yaml"), load_config(tmp_path / "c.json")
    assert a == b
    assert a.model.d_model == 64 and a.train.lr == 1e-3
    assert Config().model.n_layers == Config().model.n_stacks * Config().model.blocks_per_stack


def test_dotted_overrides_are_typed_yaml_values(tmp_path):
    cfg = load_config(
        None,
        [
            "train.lr=5e-4",
            "model.n_stacks=3",
            "masking.mask_ratio=[0.1, 0.4]",
            "objective.name=mlm",
            "data.files=a.txt",
            "data.source=files",
        ],
    )
    assert cfg.train.lr == 5e-4 and cfg.model.n_stacks == 3
    assert cfg.masking.mask_ratio == (0.1, 0.4)
    assert cfg.data.files == ["a.txt"]
    assert parse_override("a.b=") == (["a", "b"], None)
    with pytest.raises(StackWiseError, match=r"section\.key=value"):
        parse_override("train.lr")


def test_unknown_key_suggests_nearest():
    with pytest.raises(StackWiseError, match="did you mean 'blocks_per_stack'"):
        from_dict({"model": {"blocks_per_stak": 2}})
    with pytest.raises(StackWiseError, match=r"did you mean 'model\.blocks_per_stack'"):
        from_dict({"blocks_per_stack": 2})
    with pytest.raises(StackWiseError, match=r"Unknown config key 'train\.nonsense'"):
        from_dict({"train": {"nonsense": 1}})


def test_every_unknown_key_is_named_at_once():
    """A file with three typos gets all three in one error, each with its own hint."""
    with pytest.raises(StackWiseError) as err:
        from_dict({"model": {"blocks_per_stak": 2, "d_modle": 8}, "train": {"nonsense": 1}})
    text = str(err.value)
    assert text.startswith("3 unknown config keys")
    assert "'model.blocks_per_stak' — did you mean 'blocks_per_stack'" in text
    assert "'model.d_modle' — did you mean 'd_model'" in text and "'train.nonsense'" in text


def test_a_stack_overrides_masking_keys_are_checked_with_the_others():
    """A stack's masking dict holds masking keys: a typo there is named with the rest at once."""
    stacks = {1: {"masking": {"epss": 0.2}, "lrr": 1}}
    with pytest.raises(StackWiseError) as err:
        from_dict({"progressive": {"strategy": "progressive", "stacks": stacks}, "trian": {}})
    text = str(err.value)
    assert text.startswith("3 unknown config keys")
    assert "'progressive.stacks.1.masking.epss' — did you mean 'eps'" in text


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"model": {"d_model": 0}}, "model.d_model"),
        ({"train": {"batch_size": -4}}, "train.batch_size"),
        ({"model": {"d_model": 100, "n_heads": 3}}, "n_heads (3) must divide d_model (100)"),
        ({"model": {"n_heads": 4, "n_kv_heads": 3}}, "n_kv_heads"),
        ({"masking": {"mask_ratio": 1.5}, "objective": {"name": "mlm"}}, "mask_ratio"),
        ({"train": {"warmup_steps": 5, "warmup_ratio": 0.1}}, "not both"),
        (
            {"data": {"mode": "instruction", "files": ["a.jsonl"], "dataset_dir": "rows"}},
            "reads rows from exactly one",
        ),
        ({"data": {"source": "files"}}, "needs data.files"),
        ({"data": {"seq_len": 512}}, "exceeds model.max_seq_len"),
    ],
)
def test_bad_values_name_the_field(data, needle):
    with pytest.raises(StackWiseError) as err:
        from_dict(data)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "data",
    [
        {"masking": {"mask_ratio": 0.3}},  # clm has no masking
        {"masking": {"schedule": "cosine"}, "objective": {"name": "mlm"}},
        {"objective": {"name": "clm", "weighting": "uniform"}},
        {"model": {"time_conditioning": "sinusoidal"}},  # time needs diffusion
        {"model": {"time_conditioning": "learned"}, "objective": {"name": "diffusion"}},
        {"train": {"scheduler": "constant", "warmup_steps": 10}},
        {"train": {"scheduler": "cosine", "poly_power": 2.0}},
        {"train": {"group_lr": {"head": 0.1}}},  # tied head has no group of its own
        {"train": {"group_lr": {"time": 0.1}}},
        {"data": {"source": "shakespeare", "files": ["x.txt"]}},  # files with the built-in corpus
        {"data": {"tokenizer": "tok", "bpe_vocab_size": 1000}},
        {"data": {"tokenizer": "byte", "bpe_sample_mb": 8}},
        {
            "model": {"source": "hf", "model_name_or_path": "x"},  # accepted without the key
            "data": {"mode": "instruction", "files": ["chat.jsonl"], "bpe_sample_mb": 8},
        },
        {"objective": {"name": "diffusion"}, "masking": {"num_time_steps": 8, "eps": 0.01}},
        {"objective": {"name": "diffusion"}, "masking": {"schedule": "table"}},
    ],
)
def test_settings_that_would_do_nothing_are_refused(data):
    with pytest.raises(StackWiseError):
        from_dict(data)


def test_table_schedule_validation():
    ok = from_dict(
        {
            "objective": {"name": "diffusion"},
            "masking": {
                "schedule": "table",
                "num_time_steps": 10,
                "time_step_mask_fractions": {0: 0.15, 5: 0.5, 9: 0.9},
            },
        }
    )
    assert ok.masking.time_step_mask_fractions == {0: 0.15, 5: 0.5, 9: 0.9}
    for fracs in ({0: 0.5, 5: 0.2}, {0: 0.1, 12: 0.9}, {0: 0.0}):
        with pytest.raises(StackWiseError):
            from_dict(
                {
                    "objective": {"name": "diffusion"},
                    "masking": {
                        "schedule": "table",
                        "num_time_steps": 10,
                        "time_step_mask_fractions": fracs,
                    },
                }
            )


def test_malformed_and_non_mapping_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_model: 64\ntrain: [")
    with pytest.raises(StackWiseError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(StackWiseError, match="must be a mapping"):
        load_config(lst)
    with pytest.raises(StackWiseError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


configs = st.fixed_dictionaries(
    {},
    optional={
        "model": st.fixed_dictionaries(
            {},
            optional={
                "d_model": st.sampled_from([32, 64, 128]),
                "n_stacks": st.integers(1, 6),
                "tie_embeddings": st.booleans(),
                "dropout": st.floats(0, 0.5),
            },
        ),
        "train": st.fixed_dictionaries(
            {},
            optional={
                "lr": st.floats(1e-6, 1.0),
                "scheduler": st.sampled_from(["linear", "cosine", "polynomial"]),
                "warmup_steps": st.integers(0, 100),
                "betas": st.tuples(st.floats(0, 0.99), st.floats(0, 0.999)),
            },
        ),
        "sample": st.fixed_dictionaries({}, optional={"prompt": st.text(max_size=20)}),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_yaml_round_trip_is_exact(data):
    cfg = from_dict(data)
    again = from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "model",
                    "train",
                    "d_model",
                    "lr",
                    "x",
                    "data",
                    "files",
                    "masking",
                    "n_heads",
                    "objective",
                    "name",
                    "progressive",
                    "lora",
                    "quant",
                    "qlora_rank",
                    "lora_lr",
                    "eval_steps",
                    "quantization_type",
                    "save_steps",
                    "resume_from_checkpoint",
                    "enabled_extensions",
                ]
            )
            | st.text(max_size=5),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(yaml_values)
def test_fuzz_any_yaml_gives_config_or_stackwise_error(value):
    try:
        from_dict(value)
    except StackWiseError as err:
        assert str(err)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_raw_yaml_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with contextlib.suppress(StackWiseError):
        load_config(path)


def _literal_fields() -> list[tuple[str, tuple[str, ...]]]:
    """(dotted path, string choices) of every Literal field in the schema that a YAML boolean
    could collide with (a field that also takes a bool reads it as one)."""
    import typing

    from pydantic import BaseModel

    from stackwise.config.base import _string_choices

    found = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            elif bool in typing.get_args(ann):
                continue
            elif choices := _string_choices(ann):
                found.append((f"{prefix}{name}", choices))

    walk(Config, "")
    return found


LITERALS = _literal_fields()
YAML_BOOL_WORDS = ["no", "No", "NO", "off", "false", "yes", "on", "true", "Off", "True"]


def test_yaml_booleans_that_name_a_choice_are_read_as_that_choice(tmp_path):
    cfg = load_config(None, ["train.mixed_precision=no"])
    assert cfg.train.mixed_precision == "no"
    assert load_config(None, ["train.mixed_precision=false"]).train.mixed_precision == "no"
    (tmp_path / "c.yaml").write_text("train:\n  mixed_precision: no\n")
    assert load_config(tmp_path / "c.yaml").train.mixed_precision == "no"
    assert yaml.safe_load(cfg.to_yaml())["train"]["mixed_precision"] == "no"  # quoted on save


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(LITERALS), word=st.sampled_from(YAML_BOOL_WORDS))
def test_every_choice_field_takes_yaml_booleans_or_says_how_to_quote(field, word):
    path, choices = field
    as_bool = yaml.safe_load(word)
    assert isinstance(as_bool, bool)
    colliding = [c for c in choices if yaml.safe_load(c) is as_bool]
    try:
        cfg = load_config(None, [f"{path}={word}"])
    except StackWiseError as err:
        assert not colliding, f"{path}={word} should read as {colliding}"
        assert "quote it" in str(err)
        return
    assert colliding, f"{path}={word} was accepted although no choice is a boolean word"
    node = cfg
    for part in path.split("."):
        node = getattr(node, part)
    assert node == colliding[0]


def test_section_and_cross_section_problems_come_in_one_message():
    """A section's own problem no longer hides the rules across sections: loading and derive
    run them all, and a nested section (a per-stack override) is checked too."""
    from stackwise.config import derive

    bad = {
        "model": {"n_heads": 3},  # a model rule
        "masking": {"num_time_steps": 10, "eps": 0.01},  # masking rules (and clm relevance)
        "data": {"seq_len": 4096},  # a cross rule: longer than model.max_seq_len
        "progressive": {"strategy": "progressive", "stacks": {0: {"steps": 5, "epochs": 1}}},
    }
    with pytest.raises(StackWiseError) as err:
        from_dict(bad)
    text = str(err.value)
    for needle in ("must divide d_model", "masking.eps bounds", "exceeds model.max_seq_len"):
        assert needle in text, needle
    assert "progressive.stacks.0" in text
    with pytest.raises(StackWiseError) as err:
        derive(from_dict({}), {"model.n_heads": 3, "data.seq_len": 4096})
    assert "must divide d_model" in str(err.value) and "exceeds" in str(err.value)
    with pytest.raises(ValueError, match="must divide d_model"):  # a section on its own
        ModelConfig(n_heads=3)
    with pytest.raises(StackWiseError) as err:  # a type error stops the cross rules, not these
        from_dict({"model": {"n_heads": 3}, "train": {"max_steps": "abc"}})
    assert "must divide d_model" in str(err.value) and "train.max_steps" in str(err.value)
    stacks = {0: {"masking": {"mask_ratio": 0.2, "eps": 0.01}}}
    with pytest.raises(StackWiseError) as err:  # a stack's own problems, one item each
        from_dict({"progressive": {"strategy": "progressive", "stacks": stacks}})
    text = str(err.value)
    assert "(1) progressive.stacks.0 makes an invalid config: masking.mask_ratio" in text
    assert text.count("problems:") == 1
    assert "(2) progressive.stacks.0 makes an invalid config: masking.eps" in text


def test_all_problems_of_a_config_are_reported_together():
    with pytest.raises(StackWiseError) as err:
        from_dict(
            {
                "model": {"d_model": 96, "n_heads": 5},
                "train": {"warmup_steps": 5, "warmup_ratio": 0.1, "poly_power": 2.0},
            }
        )
    text = str(err.value)
    assert "problems" in text
    for needle in ("must divide d_model", "not both", "poly_power only applies"):
        assert needle in text, needle
    with pytest.raises(StackWiseError) as err:
        from_dict({"objective": {"name": "clm"}, "sample": {"steps": 3, "block_length": 2}})
    assert "sample.steps" in str(err.value) and "sample.block_length" in str(err.value)


def test_naming_data_files_means_source_files_unless_source_is_given():
    """docs/cli.md: `data.files=[a.txt,b.jsonl]` alone works; an explicit source is checked."""
    assert load_config(None, ["data.files=[a.txt,b.jsonl]"]).data.source == "files"
    assert load_config(None, ["data.dataset_dir=somewhere"]).data.source == "files"
    assert load_config(None).data.source == "shakespeare"
    with pytest.raises(StackWiseError, match="only applies to source: files"):
        load_config(None, ["data.source=shakespeare", "data.files=[a.txt]"])
    chat = load_config(
        None, ["data.mode=instruction", "data.files=[c.jsonl]", "data.tokenizer=byte"]
    )
    assert chat.data.source == "shakespeare"  # instruction rows take no source


def test_an_override_under_a_legacy_name_replaces_the_files_key(tmp_path):
    """`eval_steps=50` over a preset's train.eval_every (and the other way round); both names
    on one command line are refused, as both in one file are."""
    (tmp_path / "a.yaml").write_text("train: {eval_every: 100}\n")
    (tmp_path / "b.yaml").write_text("eval_steps: 100\n")
    assert load_config(tmp_path / "a.yaml", ["eval_steps=7"]).train.eval_every == 7
    assert load_config(tmp_path / "b.yaml", ["train.eval_every=7"]).train.eval_every == 7
    assert load_config(tmp_path / "b.yaml", ["eval_steps=5", "eval_steps=7"]).train.eval_every == 7
    with pytest.raises(StackWiseError) as err:
        load_config(tmp_path / "a.yaml", ["eval_steps=7", "train.eval_every=8"])
    assert "'eval_steps' and 'train.eval_every'" in " ".join(str(err.value).split())


def test_an_override_of_a_numbered_stack_edits_the_files_entry(tmp_path):
    """`progressive.stacks.0.lr=...` changes the file's stack 0 instead of replacing it."""
    (tmp_path / "p.yaml").write_text(
        "progressive: {strategy: progressive, steps_per_stack: 5, stacks: {0: {steps: 9}}}\n"
    )
    cfg = load_config(tmp_path / "p.yaml", ["progressive.stacks.0.lr=0.1"])
    assert cfg.progressive.stacks[0].steps == 9 and cfg.progressive.stacks[0].lr == 0.1


def test_a_stage_budget_on_the_default_preset_names_the_key_that_budgets_it():
    """The default preset splits train.max_steps over its stacks (budget shares): a stack's
    own budget is refused, not ignored; a cached preset budgets each stack itself, and there
    train.max_steps is refused."""
    from stackwise.cli.common import load_args

    with pytest.raises(StackWiseError) as err:
        load_args(["progressive.steps_per_stack=3"])
    said = " ".join(str(err.value).split())
    assert "budget_share splits train.max_steps" in said and "steps_per_stack" in said
    assert load_args(["train.max_steps=10"]).train.max_steps == 10
    with pytest.raises(StackWiseError) as err:
        load_args(["tiny-diffusion-progressive-cached", "train.max_steps=10"])
    assert "progressive.steps_per_stack" in " ".join(str(err.value).split())


@pytest.mark.parametrize("override", ["train.lr=yes", "train.max_steps=true", "model.d_model=on"])
def test_a_yaml_boolean_where_a_number_goes_is_refused(override):
    """pydantic reads True as 1: `lr: yes` would train at lr 1.0 without a word."""
    with pytest.raises(StackWiseError, match="takes a number, but got a boolean"):
        load_config(PRESETS / "tiny-clm.yaml", [override])


def test_one_dotted_path_setter_serves_overrides_aliases_derive_and_finetune_flags(tiny):
    """lora.rank reaches the config one way, whether typed as an override, a seed's flat
    name, a derived change or a finetune flag."""
    from stackwise.config import apply_aliases, apply_overrides, derive
    from stackwise.config.paths import put
    from stackwise.fronts.finetune_flags import _put

    data: dict = {}
    put(data, "lora.rank", 4)
    assert data == {"lora": {"rank": 4}}
    assert apply_overrides({}, ["lora.rank=4"]) == data
    assert apply_aliases({"qlora_rank": 4}) == data
    flags: dict = {}
    _put(flags, "lora.rank", 4)
    assert flags == data
    with pytest.raises(StackWiseError, match=r"lora\.rank needs lora\.enabled"):
        derive(tiny(), {"lora.rank": 4})  # it reached the key, and every rule saw it
    with pytest.raises(StackWiseError, match=r"sets lora\.rank twice"):
        put(data, "lora.rank", 8, clash="--lora_rank")
    with pytest.raises(StackWiseError, match="'rank' is a value, not a section"):
        apply_overrides({"lora": {"rank": 4}}, ["lora.rank.x=1"])
