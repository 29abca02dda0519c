"""Seed 002 (the enhanced training system): each example as the seed writes it, on tiny models
and local data, asserting what the seed says it does; import paths are `stackwise`'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_dict
from hf_fixtures import chat_file, hf_config, tiny_hf

import stackwise
from stackwise import (
    CheckpointManager,
    DialogueModelAdapter,
    EnhancedTrainer,
    ExtensionManager,
    FinetuningStrategy,
    MetricsLogger,
    ModelAdapter,
    StandardModelAdapter,
    StandardTrainingStrategy,
    TrainerFactory,
    TrainingConfig,
    get_model_adapter,
    get_training_strategy,
    register_training_strategy,
)
from stackwise.config import from_dict
from stackwise.config.seed_layouts.enhanced import LAYOUT
from stackwise.errors import StackWiseError
from stackwise.model.memory import MemoryLayer, memory_layers
from stackwise.strategies import STRATEGIES, TrainingStrategy
from stackwise.train.extensions import EXTENSIONS, HOOKS, Extension, register_extension
from stackwise.train.strategy import STRATEGY_FAMILY

EXAMPLES = [
    ("architecture", "the component diagram: the EnhancedTrainer coordinating ModelAdapter, "
     "TrainingStrategy, ExtensionManager and CheckpointManager (standard/dialogue adapters, "
     "memory/quantum extensions)"),
    ("file_structure", "the package layout: each named module's class, with its responsibility"),
    ("trainer_factory", "TrainerFactory().create_trainer(model_config, training_config, "
     "data_config)"),
    ("developer_components", "get_model_adapter('standard', model_config, training_config, "
     "device), get_training_strategy('standard', training_config), EnhancedTrainer(..., "
     "model_adapter=, training_strategy=)"),
    ("curriculum_strategy", "class CurriculumStrategy(TrainingStrategy): __init__(config, "
     "logger) reading config.curriculum_stages, and train_step(...)"),
    ("curriculum_usage", "get_training_strategy('curriculum', training_config)"),
    ("model_extensions", "training_config.enabled_extensions = ['memory', 'quantum']; "
     "EnhancedTrainer(...); trainer.initialize_model()"),
]  # fmt: skip


def one_paragraph(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def val_losses(trainer: EnhancedTrainer) -> list[float]:
    return [row["loss"] for row in trainer.state.history]


# -- the diagram: the Trainer coordinates its parts -------------------------------------------


class Recorder(Extension):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattribute__(self, name: str):
        if name in HOOKS:
            self.calls.append(name)
        return super().__getattribute__(name)


def test_architecture(tiny):
    register_extension("recorder_002")(Recorder)
    try:
        config = tiny(train={"enabled_extensions": ["recorder_002"], "save_steps": 2})
        trainer = EnhancedTrainer(
            model_config=config.model, training_config=config.train, data_config=config.data
        )
        steps: list[int] = []
        step = trainer.strategy.train_step
        trainer.strategy.train_step = lambda *a: steps.append(1) or step(*a)
        trainer.train()
    finally:
        EXTENSIONS.unregister("recorder_002")
    assert isinstance(trainer.adapter, StandardModelAdapter)  # the rack: the standard adapter
    assert isinstance(trainer.strategy, StandardTrainingStrategy) and len(steps) == 4
    assert isinstance(trainer.extensions, ExtensionManager)
    assert isinstance(trainer.checkpoints, CheckpointManager)
    assert isinstance(trainer.metrics, MetricsLogger)
    recorder = next(e for e in trainer.extensions if isinstance(e, Recorder))
    assert {"on_train_begin", "on_step_end", "on_eval", "on_save", "on_train_end"} <= set(
        recorder.calls
    )
    assert Path(config.train.output_dir or "", "checkpoint-4").is_dir()
    # the diagram's leaves: the dialogue adapter, the memory extension (quantum: below)
    assert isinstance(get_model_adapter("dialogue"), DialogueModelAdapter)
    assert "memory" in EXTENSIONS.names()


# -- the file structure: each named part, doing its job ---------------------------------------

PARTS = {
    "enhanced_trainer.py": "EnhancedTrainer",
    "model_adapters/base_adapter.py": "ModelAdapter",
    "model_adapters/standard_adapter.py": "StandardModelAdapter",
    "model_adapters/dialogue_adapter.py": "DialogueModelAdapter",
    "strategies/base_strategy.py": "TrainingStrategy",
    "strategies/standard_strategy.py": "StandardTrainingStrategy",
    "strategies/finetune_strategy.py": "FinetuningStrategy",
    "extensions/extension_hooks.py": "Extension",
    "extensions/extension_manager.py": "ExtensionManager",
    "checkpoints/checkpoint_manager.py": "CheckpointManager",
    "metrics/metrics_logger.py": "MetricsLogger",
    "trainer_factory.py": "TrainerFactory",
}


def test_file_structure():
    for seed_file, name in PARTS.items():
        assert isinstance(getattr(stackwise, name), type), seed_file
    assert {"standard", "finetuning"} <= set(STRATEGIES)
    assert {"dialogue", "hf", "rack"} <= set(stackwise.train.adapters.ADAPTERS.names())
    with pytest.raises(StackWiseError) as err:  # multimodal_adapter.py: no seed defines one
        get_model_adapter("multimodal")
    text = one_paragraph(err)
    assert "defined by none" in text and "register_model_adapter('multimodal')" in text
    assert "dialogue, hf, rack, standard" in text


def test_dialogue_adapter_scores_the_replies_only(tmp_path):
    chat = chat_file(tmp_path / "chat.jsonl", n=24)
    config = from_dict(chat_rack(chat, tmp_path / "run"))
    trainer = TrainerFactory().create_trainer(config.model, config.train, config.data)
    assert type(trainer.adapter) is DialogueModelAdapter
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    replies = [r["train/reply_tokens"] for r in rows if "train/reply_tokens" in r]
    assert replies and all(0 < n < 4 * 128 for n in replies)  # the replies, not the prompts
    plain = from_dict(chat_rack(chat, tmp_path / "plain", data={"mode": "pretraining"}))
    adapter = get_model_adapter("dialogue", plain.model, plain.train)
    with pytest.raises(StackWiseError) as err:
        EnhancedTrainer(
            model_config=plain.model,
            training_config=plain.train,
            data_config=plain.data,
            model_adapter=adapter,
        )
    assert "data.mode: instruction" in one_paragraph(err)


def chat_rack(chat: Path, out: Path, **sections: dict) -> dict:
    base = {
        "model": {"n_stacks": 1, "blocks_per_stack": 1, "d_model": 32, "n_heads": 2},
        "data": {"mode": "instruction", "files": [str(chat)], "seq_len": 128, "tokenizer": "byte"},
        "train": {"max_steps": 3, "batch_size": 4, "eval_every": 3, "eval_batches": 1},
        "logging": {"tensorboard": False, "progress_bar": "never", "console": False},
        "sample": {"num_samples": 0},
    }
    base["train"] |= {"output_dir": str(out), "mixed_precision": "no"}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


def test_finetuning_strategy_trains_the_adapters_alone(tiny):
    config = tiny(train={"enabled_extensions": ["memory"], "lr": 1e-2})
    strategy = get_training_strategy("finetuning", config.train)
    trainer = EnhancedTrainer(
        model_config=config.model,
        training_config=config.train,
        data_config=config.data,
        training_strategy=strategy,
    )
    model = trainer.initialize_model()
    memory = {id(p) for layer in memory_layers(model) for p in layer.parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    base = [(n, p) for n, p in model.named_parameters() if id(p) not in memory]
    assert base and all(torch.equal(before[n], p) and not p.requires_grad for n, p in base)
    moved = [n for n, p in model.named_parameters() if not torch.equal(before[n], p)]
    assert moved and all(".memory." in n for n in moved)  # the memory layers trained
    plain = tiny(train={"output_dir": str(Path(config.train.output_dir).parent / "plain")})
    with pytest.raises(StackWiseError) as err:
        EnhancedTrainer(
            model_config=plain.model,
            training_config=plain.train,
            data_config=plain.data,
            training_strategy=get_training_strategy("finetuning"),
        )
    assert "has none" in one_paragraph(err) and "'standard' strategy" in str(err.value)


def test_checkpoint_manager_rotates_and_keeps_extension_state(tiny):
    config = tiny(train={"enabled_extensions": ["memory"], "save_steps": 1, "save_total_limit": 2})
    trainer = TrainerFactory().create_trainer(config.model, config.train, config.data)
    trainer.train()
    out = Path(config.train.output_dir)
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    assert kept == ["checkpoint-3", "checkpoint-4"]  # rotation pruned the older ones
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["extensions"]["memory"]["steps"] == 4  # the memory extension's own state
    resumed = tiny(
        train={
            "enabled_extensions": ["memory"],
            "max_steps": 6,
            "resume_from_checkpoint": str(out / "checkpoint-4"),
            "output_dir": str(out.parent / "resumed"),
        }
    )
    again = TrainerFactory().create_trainer(resumed.model, resumed.train, resumed.data)
    again.train()
    memory = next(e for e in again.extensions if e.name == "memory")
    assert again.state.step == 6 and memory.steps == 6  # counted on from the checkpoint


def test_metrics_logger_writes_every_sink(tiny, capsys):
    config = tiny(logging={"console": True, "jsonl": True, "tensorboard": True})
    trainer = TrainerFactory().create_trainer(config.model, config, config.data)
    assert [s.name for s in trainer.metrics.sinks][1:] == ["console", "jsonl", "tensorboard"]
    trainer.train()
    out = Path(config.train.output_dir)
    assert "train/loss=" in capsys.readouterr().out  # console
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]  # file
    assert any("train/loss" in r for r in rows) and any("val/loss" in r for r in rows)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert {"train/loss", "val/loss"} <= set(events.Tags()["scalars"])  # TensorBoard


# -- migration path for users: the factory ----------------------------------------------------


def test_trainer_factory(tiny, corpus_file, cache_dir, tmp_path):
    config = tiny()
    model_config, training_config, data_config = config.model, config.train, config.data
    trainer_factory = TrainerFactory()
    trainer = trainer_factory.create_trainer(model_config, training_config, data_config)
    assert isinstance(trainer, EnhancedTrainer)
    assert isinstance(trainer.adapter, StandardModelAdapter)
    assert type(trainer.strategy) is StandardTrainingStrategy
    trainer.train()
    assert trainer.state.step == 4 and val_losses(trainer)[-1] < val_losses(trainer)[0]
    # a whole seed config as training_config: its extensions are chosen too
    sections = tiny_dict(corpus_file, cache_dir, tmp_path / "whole")
    training_config = TrainingConfig(enabled_extensions=["memory"], **sections)
    trainer = trainer_factory.create_trainer(None, training_config, None)
    assert memory_layers(trainer.initialize_model())
    assert [e.name for e in trainer.extensions] == ["memory"]


def test_trainer_factory_fine_tunes_a_hugging_face_model(tmp_path):
    model_dir = tiny_hf(tmp_path / "llama")
    config = hf_config(model_dir, chat_file(tmp_path / "chat.jsonl", n=24), tmp_path / "run")
    # the whole config as training_config: its lora section is one the three sections lack
    assert TrainerFactory.components(config.model, config, config.data) == {
        "model_adapter": "hf",
        "training_strategy": "finetuning",
        "extensions": "none",
    }
    trainer = TrainerFactory().create_trainer(config.model, config, config.data)
    assert type(trainer.strategy) is FinetuningStrategy
    model = trainer.initialize_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    for name, p in model.named_parameters():  # the base frozen, the LoRA weights trained
        assert torch.equal(before[name], p.detach()) != ("lora_" in name), name


# -- migration path for developers: the parts by hand -----------------------------------------


def test_developer_components(tiny):
    config = tiny()
    model_config, training_config, data_config = config.model, config.train, config.data
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model_adapter = get_model_adapter("standard", model_config, training_config, device)
    training_strategy = get_training_strategy("standard", training_config)

    trainer = EnhancedTrainer(
        model_config=model_config,
        training_config=training_config,
        data_config=data_config,
        model_adapter=model_adapter,
        training_strategy=training_strategy,
    )
    assert trainer.adapter is model_adapter and model_adapter.device.type == device.type
    assert isinstance(trainer.strategy, StandardTrainingStrategy)
    assert next(trainer.initialize_model().parameters()).device.type == device.type
    trainer.train()
    assert trainer.state.step == 4 and val_losses(trainer)[-1] < val_losses(trainer)[0]


def test_developer_components_refuse_what_cannot_work(tiny):
    config = tiny()
    elsewhere = "cpu" if torch.cuda.is_available() else "cuda"
    with pytest.raises(StackWiseError) as err:
        get_model_adapter("standard", config.model, config.train, elsewhere)
    assert "this process trains on" in one_paragraph(err)
    other = tiny(model={"d_model": 48})
    adapter = get_model_adapter("standard", other.model, other.train)
    with pytest.raises(StackWiseError) as err:
        EnhancedTrainer(
            model_config=config.model,
            training_config=config.train,
            data_config=config.data,
            model_adapter=adapter,
        )
    assert "model sections differ" in one_paragraph(err)
    # an adapter made with the sections lends them to a Trainer given only the data
    lent = EnhancedTrainer(data_config=config.data, model_adapter=adapter)
    assert lent.initialize_model().embed_tokens.weight.shape[1] == 48


# -- a new training strategy: the curriculum --------------------------------------------------


class CurriculumStrategy(TrainingStrategy):
    """A sequence-length curriculum: stage i trains on the first `seq_len` tokens of each row
    until step `until_step`."""

    def __init__(self, config, logger=None):
        super().__init__(config, logger)
        self.curriculum_stages = config.curriculum_stages
        self.current_stage = 0
        self.lengths: list[tuple[int, int]] = []  # (step, tokens per row) of each micro-batch

    def train_step(self, model, batch, optimizer, scaler, scheduler, update_gradients=True):
        step = self.context.step
        while step >= self.curriculum_stages[self.current_stage]["until_step"]:
            self.current_stage += 1
        length = self.curriculum_stages[self.current_stage]["seq_len"]
        short = {k: v[:, :length] if v.dim() == 2 else v for k, v in batch.items()}
        self.lengths.append((step, short["input_ids"].shape[1]))
        return super().train_step(model, short, optimizer, scaler, scheduler, update_gradients)


STAGES = [{"until_step": 2, "seq_len": 8}, {"until_step": 4, "seq_len": 32}]


@pytest.fixture
def curriculum():
    register_training_strategy("curriculum")(CurriculumStrategy)  # the strategy map
    yield
    STRATEGY_FAMILY.unregister("curriculum")


def test_curriculum_strategy(tiny, curriculum):
    training_config = tiny(train={"strategy_options": {"curriculum_stages": STAGES}}).train
    strategy = CurriculumStrategy(training_config)
    assert strategy.curriculum_stages == STAGES and strategy.current_stage == 0
    assert strategy.config is training_config and "curriculum" in STRATEGIES
    with pytest.raises(AttributeError, match="strategy_options does not set it"):
        CurriculumStrategy(tiny().train)  # its setting missing: said, not a silent default
    with pytest.raises(AttributeError, match="did you mean 'max_steps'"):
        training_config.max_step = 3  # a typo of our own key is no strategy option


def test_curriculum_usage(tiny, curriculum):
    config = tiny(train={"strategy_options": {"curriculum_stages": STAGES}})
    training_config = config.train

    strategy = get_training_strategy("curriculum", training_config)

    trainer = EnhancedTrainer(
        model_config=config.model,
        training_config=training_config,
        data_config=config.data,
        training_strategy=strategy,
    )
    trainer.train()
    ran = trainer.strategy  # the Trainer's own copy ran the user's step
    assert ran.lengths == [(0, 8), (1, 8), (2, 32), (3, 32)] and ran.current_stage == 1
    out = Path(training_config.output_dir or "").parent / "pipeline"
    whole = tiny(train={"strategy_options": {"curriculum_stages": STAGES}, "output_dir": str(out)})
    result = stackwise.train_from_config(whole, quiet=True, strategy="curriculum")
    assert result.trainer.strategy.lengths[-1] == (3, 32)  # the pipeline hands it config.train
    with pytest.raises(StackWiseError) as err:  # options with a strategy that reads none
        TrainerFactory().create_trainer(config.model, training_config, config.data)
    assert "does not read" in one_paragraph(err) and "curriculum_stages" in str(err.value)


# -- model extensions -------------------------------------------------------------------------


def test_model_extensions(tiny):
    config = tiny()
    model_config, training_config, data_config = config.model, config.train, config.data

    training_config.enabled_extensions = ["memory", "quantum"]
    with pytest.raises(StackWiseError) as err:
        EnhancedTrainer(
            model_config=model_config, training_config=training_config, data_config=data_config
        )
    text = one_paragraph(err)
    assert "'quantum'" in text and "never define" in text and "register_extension" in text
    assert "memory" in text

    training_config.enabled_extensions = ["memory"]
    trainer = EnhancedTrainer(
        model_config=model_config, training_config=training_config, data_config=data_config
    )
    model = trainer.initialize_model()
    layers = memory_layers(model)
    assert layers and all(isinstance(m, MemoryLayer) for m in layers)
    trainer.train()
    memory = next(e for e in trainer.extensions if e.name == "memory")
    assert memory.steps == 4 and len(memory.shares()) == len(layers)


# -- the seed's config keys -------------------------------------------------------------------


def test_every_layout_key_lands_and_acts(tiny, curriculum):
    assert set(LAYOUT.keys) == {"enabled_extensions", "curriculum_stages"}
    values = {"enabled_extensions": ["memory"], "curriculum_stages": STAGES}
    for key, value in values.items():
        config = TrainingConfig(**{key: value})
        node = config
        for part in LAYOUT.keys[key].target.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        assert node == value and getattr(config, key) == value, key
    assert TrainingConfig(enabled_extensions=["memory"]).memory_on  # memory layers built
    stages = TrainingConfig(curriculum_stages=STAGES)
    assert get_training_strategy("curriculum", stages).curriculum_stages == STAGES
    trainer_config = tiny()
    trainer_config.train.strategy_options["curriculum_stages"] = STAGES
    with pytest.raises(StackWiseError, match="does not read"):
        TrainerFactory().create_trainer(
            trainer_config.model, trainer_config.train, trainer_config.data
        )
    assert isinstance(get_model_adapter("standard"), ModelAdapter)
