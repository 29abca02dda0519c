"""Seed 001 (the training infrastructure): each example as the seed writes it, on tiny models
and local stand-ins for its hub datasets, asserting what the seed says it does; import paths
are `stackwise`'s."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import tiny_dict
from hf_fixtures import tiny_hf

import stackwise
from stackwise import (
    MemoryAdapter,
    TextDataset,
    Trainer,
    compute_router_auxiliary_loss,
    create_dataloader,
    load_config,
)
from stackwise.config import from_dict
from stackwise.config.seed_layouts.infrastructure import LAYOUT
from stackwise.config.seed_view import get_path
from stackwise.errors import StackWiseError
from stackwise.io.files import read_tensors
from stackwise.model.memory import memory_layers
from stackwise.train.extensions import Extension, register_extension
from stackwise.train.interrupts import TrainingInterrupted
from stackwise.train.optim import lr_factor

ROOT = Path(__file__).parents[2]

EXAMPLES = [
    ("trainer_constructor", "Trainer(config, model=None): a new model from the config, or the "
     "one given"),
    ("training_flow", "trainer = Trainer(config); trainer.train(): batches, gradient "
     "accumulation, clipping, the scheduler, logging, eval, checkpoints, best model, rotation"),
    ("checkpoint_structure", "outputs/checkpoint-N/ with model.pt, config.yaml, "
     "trainer_state.json, model.safetensors, optimizer.bin, scheduler.bin"),
    ("resume_training", "config.training.resume_from_checkpoint = 'outputs/checkpoint-N'; "
     "Trainer(config).train() continues from step N"),
    ("text_dataset_modes", "TextDataset modes pretraining / instruction_finetuning; messages, "
     "conversations, prompt/response; the chat template applied"),
    ("create_dataloader", "create_dataloader(dataset_name=..., tokenizer=..., batch_size=4, "
     "max_length=4096, split='train_sft', subset=None, text_field='messages', "
     "training_mode='instruction_finetuning', num_workers=4, shuffle=True, num_samples=None)"),
    ("yaml_c4_pretraining", "training: dataset_name allenai/c4, dataset_subset en, text_field "
     "text, training_mode pretraining"),
    ("yaml_ultrachat_instruction", "training: dataset_name HuggingFaceH4/ultrachat_200k, "
     "dataset_split train_sft, text_field messages, training_mode instruction_finetuning"),
    ("yaml_codealpaca_fields", "training: dataset_name sahil2801/CodeAlpaca-20k, text_field "
     "[instruction, input, output], training_mode instruction_finetuning"),
    ("router_auxiliary_loss", "compute_router_auxiliary_loss(router_losses=[...], "
     "load_balance_coef=0.01, auxiliary_coef=0.0, z_loss_coef=0.001) and the loss formulas"),
    ("basic_training", "config = load_config('configs/...yaml'); Trainer(config).train()"),
    ("custom_model_training", "model = MemoryAdapter(config); Trainer(config, model=model)"
     ".train()"),
    ("accelerate_ddp", "accelerate launch --num_processes 4 scripts/train.py --config "
     "configs/base_small.yaml"),
    ("accelerate_fsdp", "accelerate launch --num_processes 4 --use_fsdp scripts/train.py "
     "--config configs/base_small.yaml"),
    ("config_fsdp_tip", "training.distributed_strategy: fsdp with training."
     "fsdp_sharding_strategy: FULL_SHARD"),
    ("config_reference", "the training: reference with every key"),
]  # fmt: skip

QUIET = {"console": False, "tensorboard": False, "progress_bar": "never"}
WORDS = ["alpha", "beta", "gamma", "delta", "red", "blue", "green", "cat", "dog", "sun", "moon"]


def one_paragraph(err: pytest.ExceptionInfo) -> str:
    text = " ".join(str(err.value).split())
    assert "Traceback" not in text
    return text


def seed_file(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rack_yaml(tmp: Path, corpus: Path, cache: Path, **training: Any) -> Path:
    """A tiny rack's config file with the seed's `training:` section."""
    base = tiny_dict(corpus, cache, tmp / "unused")
    data = {
        "model": base["model"],
        "data": {k: v for k, v in base["data"].items() if k != "seq_len"},
        "logging": QUIET,
        "sample": {"num_samples": 0},
        "training": {
            "max_length": 32, "batch_size": 4, "max_steps": 4, "eval_steps": 2,
            "mixed_precision": "no", "output_dir": str(tmp / "outputs"), **training,
        },
    }  # fmt: skip
    return seed_file(tmp / "config.yaml", data)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    return tiny_hf(tmp_path_factory.mktemp("seed001hf") / "qwen-stand-in", kind="qwen2")


def chat_rows(n: int, seed: int = 0) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        rows.append({"messages": [{"role": "user", "content": f"Repeat: {q}"},
                                  {"role": "assistant", "content": q}]})  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def hub_stand_ins(tmp_path_factory) -> dict[str, Path]:
    """Local folders shaped like the seed's hub datasets: C4 (configs en and de, in its README),
    UltraChat (splits train_sft and test_sft) and CodeAlpaca (instruction/input/output)."""
    import random

    import datasets

    root = tmp_path_factory.mktemp("hub")
    rng = random.Random(1)
    c4 = root / "c4"
    for name, n in (("en", 120), ("de", 7)):
        (c4 / name).mkdir(parents=True)
        lines = [json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(12))})
                 for _ in range(n)]  # fmt: skip
        (c4 / name / "c4-train.00000.json").write_text("\n".join(lines) + "\n")
    configs = "".join(
        f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {name}/*.json\n"
        for name in ("en", "de")
    )
    (c4 / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
    chat = root / "ultrachat" / "data"
    chat.mkdir(parents=True)
    datasets.Dataset.from_list(chat_rows(40)).to_parquet(
        str(chat / "train_sft-00000-of-00001.parquet")
    )
    datasets.Dataset.from_list(chat_rows(6, seed=3)).to_parquet(
        str(chat / "test_sft-00000-of-00001.parquet")
    )
    alpaca = root / "codealpaca" / "code_alpaca_20k.jsonl"
    alpaca.parent.mkdir()
    rows = []
    for _ in range(40):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
        rows.append({"instruction": "Write a list of these words.", "input": " ".join(words),
                     "output": repr(words)})  # fmt: skip
    alpaca.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return {"c4": c4, "ultrachat": root / "ultrachat", "codealpaca": alpaca.parent}


def hf_sections(model: Path, lora: bool = True) -> dict:
    """Around a seed's training: block, the model it tunes: a tiny Qwen2 stand-in with LoRA."""
    lora_section = {"enabled": lora, "rank": 4, "alpha": 8.0}
    return {
        "model": {"source": "hf", "model_name_or_path": str(model)},
        "lora": lora_section,
        "logging": QUIET,
        "sample": {"num_samples": 0},
    }


def tiny_run(out: Path, **training: Any) -> dict:
    return {"max_length": 96, "batch_size": 4, "max_steps": 2, "eval_steps": 2,
            "mixed_precision": "no", "output_dir": str(out), **training}  # fmt: skip


def metric_rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return read_tensors(folder / "model.safetensors", "")


# -- the Trainer ----------------------------------------------------------------------------


def test_trainer_constructor(tmp_path, corpus_file, cache_dir):
    config = load_config(rack_yaml(tmp_path, corpus_file, cache_dir))
    trainer = Trainer(config)
    assert isinstance(trainer, stackwise.EnhancedTrainer)
    built = trainer.unwrapped()  # built from the config
    assert built.embed_tokens.weight.shape[1] == config.model.d_model
    model = stackwise.build_rack(trainer.plan, trainer.plan.model.vocab_size)
    mine = Trainer(config, model=model)
    assert mine.unwrapped() is model  # the model given is the one trained


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory, corpus_file, cache_dir):
    """trainer = Trainer(config); trainer.train(), with every part of the loop turned on."""
    tmp = tmp_path_factory.mktemp("flow")
    path = rack_yaml(
        tmp, corpus_file, cache_dir, gradient_accumulation_steps=2, max_grad_norm=0.5,
        warmup_steps=2, scheduler="cosine", max_steps=6, logging_steps=1, eval_steps=2,
        save_steps=2, save_total_limit=1, save_best_model=True,
    )  # fmt: skip
    config = load_config(path)
    trainer = Trainer(config)
    clipped: list[float] = []
    clip = trainer.accelerator.clip_grad_norm_

    def spy(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
        clipped.append(max_norm)
        return clip(parameters, max_norm, *args, **kwargs)

    trainer.accelerator.clip_grad_norm_ = spy
    before = {k: v.clone() for k, v in trainer.unwrapped().state_dict().items()}
    state = trainer.train()
    return {"trainer": trainer, "state": state, "clipped": clipped, "before": before,
            "out": Path(config.train.output_dir), "config": config}  # fmt: skip


def test_training_flow(flow_run):
    trainer, state, out = flow_run["trainer"], flow_run["state"], flow_run["out"]
    plan = trainer.plan
    assert state.step == 6
    # two micro-batches of 4 x 32 tokens per optimizer step; one clip per optimizer step
    assert state.tokens_seen == 6 * 2 * 4 * 32
    assert flow_run["clipped"] == [0.5] * 6
    rows = metric_rows(out)
    lrs = [(r["step"], r["train/lr"]) for r in rows if "train/lr" in r]
    assert [s for s, _ in lrs] == [1, 2, 3, 4, 5, 6]  # logging_steps: 1
    for step, lr in lrs:  # warmup, then cosine decay
        assert lr == pytest.approx(plan.train.lr * lr_factor(step, plan.train))
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4, 6]  # eval_steps: 2
    after = trainer.unwrapped().state_dict()
    assert any(not torch.equal(after[k], v) for k, v in flow_run["before"].items())
    # checkpoints every 2 steps, rotated to 1 beside the best one (which rotation keeps)
    best = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    best_name = best["extensions"]["best_model"]["checkpoint"]
    assert kept == sorted({"checkpoint-6", best_name})
    # the finished run: weights, tokenizer and config, loadable as a trained rack
    assert (out / "run_complete.json").is_file() and (out / "tokenizer").is_dir()
    _, rack, _ = stackwise.load_trained(out)
    assert all(torch.equal(rack.state_dict()[k], v) for k, v in after.items())


def test_checkpoint_structure(flow_run):
    folder = flow_run["out"] / "checkpoint-6"
    names = {p.name for p in folder.iterdir()}
    seed_files = {"model.pt", "config.yaml", "trainer_state.json", "model.safetensors",
                  "optimizer.bin", "scheduler.bin"}  # fmt: skip
    assert seed_files <= names
    consolidated = torch.load(folder / "model.pt", weights_only=True)  # no pickled object
    saved = weights(folder)
    assert consolidated.keys() == saved.keys()
    assert all(torch.equal(consolidated[k], saved[k]) for k in saved)
    optimizer = torch.load(folder / "optimizer.bin", weights_only=True)
    assert len(optimizer["state"]) > 0 and optimizer["param_groups"]
    assert torch.load(folder / "scheduler.bin", weights_only=True)["last_epoch"] == 6
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["step"] == 6 and "epoch" in state
    history = [r["loss"] for r in state["history"]]
    assert state["best_metric"] == min(history) and state["metric_for_best"] == "loss"
    assert load_config(folder / "config.yaml").train.max_steps == 6


@register_extension("seed001_power_cut")
class PowerCut(Extension):
    """Sends this process SIGTERM after step 2, as a cluster's scheduler would."""

    def on_step_end(self, run: Any) -> None:
        if run.state.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def test_resume_training(tmp_path, corpus_file, cache_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    whole = tmp_path / "whole"
    whole.mkdir()
    uninterrupted = load_config(
        rack_yaml(whole, corpus_file, cache_dir, save_steps=2, output_dir="whole/outputs")
    )
    Trainer(uninterrupted).train()
    config = load_config(
        rack_yaml(tmp_path, corpus_file, cache_dir, save_steps=2, output_dir="outputs")
    )
    config.train.enabled_extensions = ["seed001_power_cut"]
    with pytest.raises(TrainingInterrupted):
        Trainer(config).train()
    assert not (tmp_path / "outputs" / "checkpoint-4").exists()
    config.train.enabled_extensions = []

    config.training.resume_from_checkpoint = "outputs/checkpoint-2"
    trainer = Trainer(config)
    state = trainer.train()  # continues from step 2
    assert trainer.resumed_from is not None and state.step == 4
    rows = metric_rows(tmp_path / "outputs")
    assert [r["step"] for r in rows if "train/loss" in r][-1] == 4
    ends = weights(whole / "outputs"), weights(tmp_path / "outputs")
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])  # bit for bit


# -- data ----------------------------------------------------------------------------------


def test_text_dataset_modes(tmp_path, hf_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_model))
    text = TextDataset([{"title": "Red sun", "body": "blue moon"}], tok, max_length=64,
                       text_field=["title", "body"], training_mode="pretraining")  # fmt: skip
    item = text[0]
    assert tok.decode(item["input_ids"]).startswith("Red sun\n\nblue moon")  # fields joined
    assert (item["labels"][1:] == item["input_ids"][1:]).all()  # every next token a target
    reply = "green cat"
    shapes = [
        {"messages": [{"role": "user", "content": "Say it"},
                      {"role": "assistant", "content": reply}]},
        {"conversations": [{"from": "human", "value": "Say it"}, {"from": "gpt", "value": reply}]},
        {"prompt": "Say it", "response": reply},
    ]  # fmt: skip
    for row in shapes:
        data = TextDataset([row], tok, max_length=128, training_mode="instruction_finetuning")
        ids, labels = data[0]["input_ids"], data[0]["labels"]
        rendered = tok.decode(ids)
        assert "<|user|>" in rendered and "<|assistant|>" in rendered  # a chat template
        assert tok.decode(labels[labels != -100]) == reply + tok.eos_token  # replies only
    own = tiny_hf(tmp_path / "templated", template="{% for m in messages %}[{{ m['role'] }}] "
                  "{{ m['content'] }}{{ eos_token }}{% endfor %}")  # fmt: skip
    tok = AutoTokenizer.from_pretrained(str(own))
    data = TextDataset([shapes[2]], tok, max_length=128, training_mode="instruction_finetuning")
    assert tok.decode(data[0]["input_ids"]).startswith("[user] Say it")  # its own template
    batch = data.collate([data[0], data[0]])
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    with pytest.raises(StackWiseError) as err:
        TextDataset([shapes[0]], tok, training_mode="chat")
    assert "'pretraining'" in one_paragraph(err)


def test_create_dataloader(tmp_path, hf_model, hub_stand_ins):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_model))
    dataloader = create_dataloader(
        dataset_name=str(hub_stand_ins["ultrachat"]),
        tokenizer=tokenizer,
        batch_size=4,
        max_length=4096,
        split="train_sft",
        subset=None,  # For datasets with configs
        text_field="messages",  # Can be string or list
        training_mode="instruction_finetuning",
        num_workers=4,
        shuffle=True,
        num_samples=None,  # Limit for testing
    )
    assert len(dataloader.dataset) == 40  # the train_sft split, not test_sft
    batch = next(iter(dataloader))
    assert batch["input_ids"].shape[0] == 4
    targets = batch["labels"][0][batch["labels"][0] != -100]
    assert tokenizer.decode(targets).endswith(tokenizer.eos_token)  # a reply, then its end
    few = create_dataloader(str(hub_stand_ins["c4"]), tokenizer, batch_size=2, max_length=16,
                            subset="de", num_samples=5, shuffle=False)  # fmt: skip
    assert len(few.dataset) == 5 and next(iter(few))["input_ids"].shape == (2, 16)
    import datasets

    saved = tmp_path / "saved"  # a save_to_disk folder of splits, and a .jsonl file
    datasets.DatasetDict({"train_sft": datasets.Dataset.from_list(chat_rows(6))}).save_to_disk(
        str(saved)
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(5)))
    for name, split in ((saved, "train_sft"), (rows, "train")):
        loader = create_dataloader(str(name), tokenizer, split=split, text_field="messages",
                                   training_mode="instruction_finetuning")  # fmt: skip
        assert len(loader.dataset) == (6 if split == "train_sft" else 5)
        with pytest.raises(StackWiseError, match="subset='en' picks a configuration"):
            create_dataloader(str(name), tokenizer, split=split, subset="en")  # none to pick
    with pytest.raises(StackWiseError) as err:
        create_dataloader(dataset_name="HuggingFaceH4/ultrachat_200k", tokenizer=tokenizer)
    assert "save_to_disk" in one_paragraph(err)


def test_yaml_c4_pretraining(tmp_path, corpus_file, cache_dir, hub_stand_ins):
    from stackwise.pipeline import prepared

    block = yaml.safe_load(
        f"""
training:
  dataset_name: {hub_stand_ins["c4"]}
  dataset_subset: en
  text_field: text
  training_mode: pretraining
"""
    )
    base = tiny_dict(corpus_file, cache_dir, tmp_path / "out")
    data = {k: v for k, v in base["data"].items() if k not in ("files", "source")}
    config = from_dict({**base, "data": data, **block})
    assert config.data.dataset_subset == "en" and config.data.mode == "pretraining"
    _, prepared_data = prepared(config)
    assert prepared_data.n_documents == 120  # the en configuration's rows, not de's
    assert Trainer(config).train().step == 4


def test_yaml_ultrachat_instruction(tmp_path, hf_model, hub_stand_ins):
    block = yaml.safe_load(
        f"""
training:
  dataset_name: {hub_stand_ins["ultrachat"]}
  dataset_split: train_sft
  text_field: messages
  training_mode: instruction_finetuning
"""
    )
    block["training"] |= tiny_run(tmp_path / "out")
    config = from_dict({**hf_sections(hf_model), **block})
    assert config.data.mode == "instruction" and config.data.dataset_split == "train_sft"
    trainer = Trainer(config)
    assert len(trainer.data.train.data) + len(trainer.data.evaluator.val_data) == 40
    trainer.train()
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()


def test_yaml_codealpaca_fields(tmp_path, hf_model, hub_stand_ins):
    block = yaml.safe_load(
        f"""
training:
  dataset_name: {hub_stand_ins["codealpaca"]}
  text_field: ["instruction", "input", "output"]  # Multiple fields
  training_mode: instruction_finetuning
"""
    )
    block["training"] |= tiny_run(tmp_path / "out")
    config = from_dict({**hf_sections(hf_model), **block})
    assert config.data.text_field == ["instruction", "input", "output"]
    trainer = Trainer(config)
    row = trainer.data.train.data[0]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_model))
    prompt = tok.decode(row["input_ids"][row["labels"] == -100])
    assert "Write a list of these words." in prompt  # instruction and input are the prompt
    assert tok.decode(row["labels"][row["labels"] != -100]).startswith("[")  # output: target
    assert trainer.train().step == 2


# -- router losses ----------------------------------------------------------------------------


def test_router_auxiliary_loss():
    total_loss = compute_router_auxiliary_loss(
        router_losses=[  # List of dicts from each router
            {"load_balance": 0.01, "z_loss": 0.001},
            {"load_balance": 0.02, "z_loss": 0.002},
        ],
        load_balance_coef=0.01,  # Weight for load balance loss
        auxiliary_coef=0.0,  # Weight for auxiliary loss
        z_loss_coef=0.001,  # Weight for z-loss
    )
    per_layer = [0.01 * 0.01 + 0.001 * 0.001, 0.01 * 0.02 + 0.001 * 0.002]
    assert float(total_loss) == pytest.approx(sum(per_layer) / 2)  # layers averaged
    from stackwise.model.routing import losses_of, router_statistics

    logits = torch.randn(10, 4)
    chosen = logits.topk(1, -1).indices
    stats = router_statistics(logits, chosen)
    losses = losses_of(stats)
    f = torch.bincount(chosen.flatten(), minlength=4).float() / 10
    p = logits.softmax(-1).mean(0)
    assert float(losses["load_balance"]) == pytest.approx(float(4 * (f * p).sum()))
    assert float(losses["auxiliary"]) == pytest.approx(float(((f - 0.25) ** 2).sum()))
    z = torch.logsumexp(logits, -1).square().mean()
    assert float(losses["z_loss"]) == pytest.approx(float(z))
    weighted = compute_router_auxiliary_loss([stats], 0.5, 2.0, 0.1)
    expected = 0.5 * losses["load_balance"] + 2.0 * losses["auxiliary"] + 0.1 * z
    assert float(weighted) == pytest.approx(float(expected))


# -- usage: a memory adapter on an HF base ----------------------------------------------------


def adapter_yaml(tmp: Path, model: Path, data: Path, **training: Any) -> Path:
    """configs/adapter_qwen2.5_1.5b.yaml's stand-in: memory layers and LoRA on a tiny Qwen2."""
    sections = hf_sections(model)
    sections["memory"] = {"chapters": 4, "slots_per_chapter": 4, "layers": [1]}
    sections["train"] = {"enabled_extensions": ["memory"]}
    run = tiny_run(tmp / "outputs", dataset_name=str(data), dataset_split="train_sft",
                   training_mode="instruction_finetuning", **training)  # fmt: skip
    (tmp / "configs").mkdir(exist_ok=True)
    return seed_file(tmp / "configs" / "adapter_qwen2.5_1.5b.yaml", {**sections, "training": run})


def test_basic_training(tmp_path, hf_model, hub_stand_ins, monkeypatch):
    adapter_yaml(tmp_path, hf_model, hub_stand_ins["ultrachat"])
    monkeypatch.chdir(tmp_path)

    # Load config and train
    config = load_config("configs/adapter_qwen2.5_1.5b.yaml")
    trainer = Trainer(config)
    memory = memory_layers(trainer.unwrapped())
    before = [m.keys.detach().clone() for m in memory]
    trainer.train()
    assert all(not torch.equal(b, m.keys) for b, m in zip(before, memory, strict=True))
    saved = read_tensors(tmp_path / "outputs" / "memory.safetensors", "")
    assert any(torch.equal(v, memory[0].keys.detach()) for v in saved.values())


def test_custom_model_training(tmp_path, hf_model, hub_stand_ins, monkeypatch):
    adapter_yaml(tmp_path, hf_model, hub_stand_ins["ultrachat"])
    monkeypatch.chdir(tmp_path)

    # Create custom model
    config = load_config("configs/adapter_qwen2.5_1.5b.yaml")
    model = MemoryAdapter(config)

    # Modify model if needed
    layer = memory_layers(model)[0]
    torch.nn.init.normal_(layer.gate, std=0.5)  # open the memory's gate a little

    # Train with custom model
    gate = layer.gate.detach().clone()
    trainer = Trainer(config, model=model)
    trainer.train()
    assert trainer.unwrapped() is model and not torch.equal(gate, layer.gate)
    with pytest.raises(StackWiseError) as err:
        MemoryAdapter(load_config(ROOT / "configs" / "tiny-clm.yaml"))
    assert "enabled_extensions" in one_paragraph(err)


# -- multi-GPU launch lines ---------------------------------------------------------------------


def accelerate_launch(tmp_path: Path, flags: list[str]) -> subprocess.CompletedProcess:
    """`accelerate launch --num_processes 2 FLAGS scripts/train.py --config
    configs/base_small.yaml`, on a port of its own (29500 may be taken or closing)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    cmd = [str(accelerate), "launch", "--num_processes", "2", *flags,
           "--main_process_port", port,
           str(ROOT / "scripts" / "train.py"), "--config", "configs/base_small.yaml"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def test_accelerate_ddp(tmp_path, corpus_file, cache_dir):
    (tmp_path / "configs").mkdir()
    path = rack_yaml(tmp_path, corpus_file, cache_dir, num_gpus=2, save_steps=2)
    path.rename(tmp_path / "configs" / "base_small.yaml")
    # no GPU here: --multi_gpu makes accelerate start its processes on the CPU (gloo)
    accelerate_launch(tmp_path, ["--multi_gpu"])
    state = json.loads((tmp_path / "outputs" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 4  # train.num_processes was checked


def test_accelerate_fsdp(tmp_path, corpus_file, cache_dir):
    """--use_fsdp: the two processes shard the model with FSDP2 (Accelerate alone would run
    DDP on a CPU); the checkpoint holds one DCP shard per process."""
    (tmp_path / "configs").mkdir()
    path = rack_yaml(tmp_path, corpus_file, cache_dir, num_gpus=2, save_steps=2)
    path.rename(tmp_path / "configs" / "base_small.yaml")
    flags = ["--use_fsdp", "--fsdp_sharding_strategy", "SHARD_GRAD_OP"]
    proc = accelerate_launch(tmp_path, flags)
    assert "sharded by FSDP2 (shard_grad_op) over 2 processes" in proc.stdout
    checkpoint = tmp_path / "outputs" / "checkpoint-4"
    assert len(list((checkpoint / "sharded").glob("*.distcp"))) == 2
    assert (tmp_path / "outputs" / "model.safetensors").is_file()  # gathered, whole


def test_config_fsdp_tip(tmp_path, corpus_file, cache_dir):
    path = rack_yaml(
        tmp_path, corpus_file, cache_dir, distributed_strategy="fsdp",
        fsdp_sharding_strategy="FULL_SHARD",
    )  # fmt: skip
    config = load_config(path)
    assert config.parallel.strategy == "fsdp" and config.parallel.sharding == "full_shard"


def test_config_reference(tmp_path, hf_model, hub_stand_ins, capsys):
    reference = yaml.safe_load(
        """
training:
  # Learning rates (separate for components)
  memory_lr: 2e-4
  lora_lr: 1e-4
  base_model_lr: 1e-5

  # Training mode
  training_mode: instruction_finetuning  # or "pretraining"

  # Dataset
  dataset_name: HuggingFaceH4/ultrachat_200k
  dataset_subset: null
  dataset_split: train_sft
  text_field: messages
  max_length: 4096

  # Distributed
  distributed_strategy: ddp  # or "fsdp"
  num_gpus: 1
  fsdp_sharding_strategy: FULL_SHARD

  # Hyperparameters
  batch_size: 4
  gradient_accumulation_steps: 4
  max_steps: 10000
  warmup_steps: 100

  # Optimizer
  optimizer: adamw
  weight_decay: 0.01
  max_grad_norm: 1.0

  # Scheduler
  scheduler: cosine  # or "linear", "constant"

  # === Mixed Precision ===
  mixed_precision: bf16        # "no", "fp16", "bf16"
  save_precision: fp32         # Optional: "fp32", "fp16", "bf16"

  # === Checkpointing ===
  gradient_checkpointing: true
  save_steps: 500              # Save checkpoint every N steps
  eval_steps: 500              # Evaluate every N steps
  save_total_limit: 3          # Keep only N recent checkpoints
  save_best_model: true        # Save model with best eval loss

  # === Early Stopping ===
  early_stopping: false        # Stop if no improvement
  early_stopping_patience: 3   # Evals to wait
  early_stopping_threshold: 0.0 # Min improvement required

  # Logging
  logging_steps: 10
  log_to_wandb: false

  # Output
  output_dir: ./outputs
"""
    )
    every = {k.removeprefix("training.") for k in LAYOUT.keys}
    assert every - set(reference["training"]) == {"resume_from_checkpoint"}  # its own example
    reference["training"]["dataset_name"] = str(hub_stand_ins["ultrachat"])  # the hub name
    sections = hf_sections(hf_model)
    sections["lora"]["modules_to_save"] = ["lm_head"]  # base_model_lr: trained base weights
    sections["memory"] = {"chapters": 4, "slots_per_chapter": 4, "layers": [1]}
    sections["train"] = {"enabled_extensions": ["memory"]}
    config = from_dict({**sections, **reference})
    real = {k: get_path(config, key.target) for k, key in LAYOUT.keys.items()}
    assert real["training.max_length"] == 4096 and real["training.memory_lr"] == 2e-4
    assert config.train.stopping_patience() is None  # early_stopping: false switches it off
    # a short run of it (a CPU's steps): every key read by the run
    short = {"max_length": 96, "gradient_accumulation_steps": 1, "max_steps": 2,
             "warmup_steps": 1, "save_steps": 2, "eval_steps": 2, "mixed_precision": "no",
             "output_dir": str(tmp_path / "outputs")}  # fmt: skip
    config = from_dict({**sections, "training": {**reference["training"], **short}})
    Trainer(config).train()
    assert "parallel.sharding full_shard has no effect" in capsys.readouterr().err
    assert (tmp_path / "outputs" / "checkpoint-2" / "model.pt").is_file()


# -- every key of the seed's training: section -------------------------------------------------

# seed key -> (a value to give it, the value our key then holds); the HF memory context below
KEY_VALUES: dict[str, tuple[Any, Any]] = {
    "training.memory_lr": (3e-4, 3e-4),
    "training.lora_lr": (2e-4, 2e-4),
    "training.base_model_lr": (2e-5, 2e-5),
    "training.training_mode": ("instruction_finetuning", "instruction"),
    "training.dataset_name": ("DATA", "DATA"),
    "training.dataset_subset": ("default", "default"),
    "training.dataset_split": ("test_sft", "test_sft"),
    "training.text_field": (["messages"], ["messages"]),
    "training.max_length": (64, 64),
    "training.distributed_strategy": ("manual", "manual"),
    "training.num_gpus": (1, 1),
    "training.fsdp_sharding_strategy": ("SHARD_GRAD_OP", "shard_grad_op"),
    "training.batch_size": (3, 3),
    "training.gradient_accumulation_steps": (3, 3),
    "training.max_steps": (7, 7),
    "training.warmup_steps": (2, 2),
    "training.optimizer": ("adam", "adam"),
    "training.weight_decay": (0.3, 0.3),
    "training.max_grad_norm": (0.25, 0.25),
    "training.scheduler": ("linear", "linear"),
    "training.mixed_precision": ("no", "no"),
    "training.save_precision": ("bf16", "bf16"),
    "training.gradient_checkpointing": (True, True),
    "training.save_steps": (2, 2),
    "training.eval_steps": (3, 3),
    "training.save_total_limit": (2, 2),
    "training.save_best_model": (True, True),
    "training.early_stopping": (True, True),
    "training.early_stopping_patience": (4, 4),
    "training.early_stopping_threshold": (0.5, 0.5),
    "training.logging_steps": (3, 3),
    "training.log_to_wandb": (True, True),
    "training.output_dir": ("OUT", "OUT"),
    "training.resume_from_checkpoint": ("latest", "latest"),
}


# what a key needs beside it to be accepted (its rules)
NEEDS = {
    "training.save_total_limit": {"save_steps": 2},
    "training.early_stopping_threshold": {"early_stopping": True},
}


def test_every_seed_key_lands_on_its_key(tmp_path, hf_model, hub_stand_ins):
    assert set(KEY_VALUES) == set(LAYOUT.keys)
    sections = hf_sections(hf_model)
    sections["lora"]["modules_to_save"] = ["lm_head"]
    sections["memory"] = {"chapters": 4, "slots_per_chapter": 4, "layers": [1]}
    sections["train"] = {"enabled_extensions": ["memory"]}
    places = {"DATA": str(hub_stand_ins["ultrachat"]), "OUT": str(tmp_path / "o")}
    base = {"dataset_name": places["DATA"], "dataset_split": "train_sft",
            "training_mode": "instruction_finetuning", "output_dir": places["OUT"]}  # fmt: skip
    plain = from_dict({**sections, "training": base})
    for path, (given, expected) in KEY_VALUES.items():
        given, expected = places.get(str(given), given), places.get(str(expected), expected)
        leaf = path.removeprefix("training.")
        context = {**base, **NEEDS.get(path, {})}
        config = from_dict({**sections, "training": {**context, leaf: given}})
        target = LAYOUT.keys[path].target
        assert get_path(config, target) == expected, path
        assert expected != get_path(plain, target) or leaf in base, path  # it changed it
        assert getattr(config.training, leaf) == expected, path  # and reads back


def test_new_keys_change_the_run(tmp_path, corpus_file, cache_dir, monkeypatch):
    """train.num_processes, optimizer, save_precision and the early_stopping switch."""
    with pytest.raises(StackWiseError) as err:
        Trainer(load_config(rack_yaml(tmp_path, corpus_file, cache_dir, num_gpus=2)))
    assert "torchrun --nproc_per_node 2" in one_paragraph(err)
    config = load_config(rack_yaml(
        tmp_path, corpus_file, cache_dir, optimizer="adam", save_precision="fp16", save_steps=4,
    ))  # fmt: skip
    trainer = Trainer(config)
    assert type(trainer.optimizer.optimizer) is torch.optim.Adam
    trainer.train()
    out = Path(config.train.output_dir)
    assert {v.dtype for v in weights(out).values()} == {torch.float16}
    pt = torch.load(out / "checkpoint-4" / "model.pt", weights_only=True)
    assert {v.dtype for v in pt.values()} == {torch.float16}
    assert {v.dtype for v in weights(out / "checkpoint-4").values()} == {torch.float32}
    assert stackwise.load_trained(out)[1].embed_tokens.weight.dtype == torch.float32  # loads back

    def stopped_at(name: str, **training: Any) -> int:
        run = tmp_path / name
        run.mkdir()
        config = load_config(rack_yaml(
            run, corpus_file, cache_dir, max_steps=8, eval_steps=1, **training
        ))  # fmt: skip
        trainer = Trainer(config)
        monkeypatch.setattr(trainer.data.evaluator, "evaluate", lambda *a: {"loss": 1.0})
        return trainer.train().step  # the loss never improves

    assert stopped_at("patience", early_stopping_patience=1) == 1
    assert stopped_at("off", early_stopping=False, early_stopping_patience=1) == 8
    assert stopped_at("on", early_stopping=True) == 3  # the default patience


def test_one_process_under_accelerate_is_noted(monkeypatch, capsys):
    from stackwise.train import hardware

    monkeypatch.setattr(hardware, "_NOTED", set())
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plan = stackwise.compile_plan(from_dict({}))
    hardware.check_launch(plan.train, plan.parallel, 1)
    assert "--multi_gpu" in capsys.readouterr().err
