"""Seed 004 (the model trainer): each example as the seed writes it, on a tiny local Hugging Face
model and small JSON files, asserting what the seed says it does; import paths are `stackwise`'s
and the hub names are the tiny model's folder."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hf_fixtures import WORDS, tiny_hf

import stackwise
from stackwise import TrainingConfig
from stackwise.cli import main as cli
from stackwise.config import load_config
from stackwise.config.seed_layouts.model_trainer import LAYOUT
from stackwise.errors import StackWiseError
from stackwise.fronts.finetune_flags import finetune_config
from stackwise.fronts.model_trainer import ModelTrainer, ReasoningDataset
from stackwise.fronts.model_trainer import main as module_main
from stackwise.train import hardware

EXAMPLES = [
    ("trainer_module", "training/trainers/model_trainer.py: the ModelTrainer module (model and "
     "tokenizer set-up, training loop, optimization, checkpoints, evaluation)"),
    ("config_file", "training/configs/default.json: training set by a config file"),
    ("default_json", "the default.json block (model_name_or_path, use_lora, load_in_4bit, "
     "lora_r/alpha/dropout, output_dir, max_seq_length, batch, accumulation, epochs, lr, weight "
     "decay, warmup_ratio, fp16, gradient_checkpointing)"),
    ("dataset_class", "ReasoningDataset: formatted examples loaded, tokenized and batched"),
    ("initialization", "config = TrainingConfig(model_name_or_path=..., use_lora=True, "
     "load_in_4bit=True, num_train_epochs=3); trainer = ModelTrainer(config)"),
    ("training", "final_checkpoint = trainer.train(train_file=..., eval_file=...), and what "
     "it saves (weights, tokenizer, training config, generation parameters)"),
    ("lora_config", "LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="
     "[q/k/v/o_proj], bias='none', task_type='CAUSAL_LM')"),
    ("cli_single_gpu", "python -m <module> --model_name_or_path ... --train_file ... "
     "--output_dir ... --use_lora True --load_in_4bit True --num_train_epochs 3 "
     "--learning_rate 2e-5 --train_batch_size 1 --gradient_accumulation_steps 4"),
    ("cli_deepspeed", "deepspeed <module file> ... --deepspeed_config ds.json"),
    ("wandb", "TrainingConfig(use_wandb=True, wandb_project=..., wandb_name=...)"),
    ("lr_scheduling", "{learning_rate, warmup_ratio, lr_scheduler_type: cosine} and the five "
     "schedulers"),
    ("precision", "{fp16: true, bf16: false}"),
    ("early_stopping", "{early_stopping_patience: 5, early_stopping_threshold: 0.01}"),
    ("model_merging", "PeftModel.from_pretrained(base_model, '<output_dir>/final'), "
     "merge_and_unload(), save_pretrained(...)"),
]  # fmt: skip

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
QUIET = {"logging": {"tensorboard": False, "console": False, "progress_bar": "never"}}


def one_paragraph(text: str) -> str:
    assert "\n" not in text.strip() and "Traceback" not in text
    return text


def _question(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))


def formatted(path: Path, n: int, fmt: str, seed: int = 0) -> Path:
    """A JSON list of formatted examples: 'Repeat: <words>' answered with the words."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for _ in range(n):
        q = _question(rng)
        if fmt == "messages":
            turns = [{"role": "user", "content": f"Repeat: {q}"}]
            rows.append({"messages": [*turns, {"role": "assistant", "content": q}]})
        elif fmt == "alpaca":
            rows.append({"instruction": "Repeat the words.", "input": q, "output": q})
        else:
            rows.append({"prompt": f"Repeat: {q}", "response": q})
    path.write_text(json.dumps(rows, indent=1))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seed004")
    data = root / "data" / "formatted"
    data.mkdir(parents=True)
    return {
        "root": root,
        "model": tiny_hf(root / "tiny-model"),
        "train": formatted(data / "combined_formatted.json", 16, "messages"),
        "eval": formatted(data / "validation.json", 4, "alpaca", seed=1),
        "small": formatted(data / "small.json", 8, "messages", seed=2),  # for batches of 1
    }


@pytest.fixture(scope="module")
def seed_run(world: dict[str, Path]) -> dict[str, Any]:
    """The seed's initialization and training snippets, run once (no output_dir: the run goes
    to outputs/<run name> under the working folder)."""
    here = Path.cwd()
    os.chdir(world["root"])
    try:
        config = TrainingConfig(
            model_name_or_path=str(world["model"]),
            use_lora=True,
            load_in_4bit=True,
            num_train_epochs=3,
        )
        trainer = ModelTrainer(config)
        final_checkpoint = trainer.train(
            train_file=str(world["train"]),
            eval_file=str(world["eval"]),  # Optional
        )
    finally:
        os.chdir(here)
    return {"config": config, "trainer": trainer, "final": final_checkpoint}


def base_keys(world: dict[str, Path], out: Path, **more: Any) -> dict[str, Any]:
    """The seed-004 keys of a tiny run, beside the keys an example's block adds."""
    return {
        "model_name_or_path": str(world["model"]),
        "train_file": str(world["train"]),
        "eval_file": str(world["eval"]),
        "output_dir": str(out),
        **more,
    }


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path


def history(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "history.json").read_text())["history"]


# ---- the examples, in the seed's order ----


def test_trainer_module(capsys):
    from stackwise.fronts import model_trainer

    assert stackwise.ModelTrainer is ModelTrainer and stackwise.ReasoningDataset is ReasoningDataset
    assert model_trainer.TrainingConfig is TrainingConfig
    assert module_main(["--help"]) == 0
    shown = capsys.readouterr().out
    for flag in ("--model_name_or_path", "--train_file", "--use_lora", "--deepspeed_config"):
        assert flag in shown


def test_config_file(world, tmp_path):
    configs = tmp_path / "training" / "configs"
    configs.mkdir(parents=True)
    file = write_json(
        configs / "default.json",
        {"model_name_or_path": str(world["model"]), "lora_r": 8, "num_train_epochs": 2},
    )
    trainer = ModelTrainer(str(file))
    assert trainer.config == load_config(file) == finetune_config(["--config", str(file)])
    assert trainer.config.lora.rank == 8 and trainer.config.train.num_train_epochs == 2


def test_default_json(world, tmp_path, capsys):
    out = tmp_path / "checkpoints" / "mistral-7b-reasoning"
    block = {
        "model_name_or_path": str(world["model"]),
        "use_lora": True,
        "load_in_4bit": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "output_dir": str(out),
        "max_seq_length": 2048,
        "train_batch_size": 1,
        "gradient_accumulation_steps": 4,
        "num_train_epochs": 3,
        "learning_rate": 2e-5,
        "weight_decay": 0.01,
        "warmup_ratio": 0.03,
        "fp16": True,
        "gradient_checkpointing": True,
    }
    file = write_json(tmp_path / "default.json", block)
    config = load_config(file)
    m, lo, tc = config.model, config.lora, config.train
    assert (m.source, config.data.mode, m.load_in_4bit, m.gradient_checkpointing) == (
        "hf", "instruction", True, True
    )  # fmt: skip
    assert (lo.enabled, lo.rank, lo.alpha, lo.dropout) == (True, 16, 32, 0.05)
    assert (config.data.seq_len, tc.batch_size, tc.grad_accum_steps) == (2048, 1, 4)
    assert (tc.num_train_epochs, tc.lr, tc.weight_decay, tc.warmup_ratio) == (3, 2e-5, 0.01, 0.03)
    assert tc.mixed_precision == "fp16" and finetune_config(["--config", str(file)]) == config
    hardware._fp16_noted.clear()
    assert cli(["finetune", "--config", str(file), "--train_file", str(world["small"])]) == 0
    err = capsys.readouterr().err
    if not torch.cuda.is_available():  # fp16 is not refused on a CPU: auto's choice, said once
        auto = "fp32" if hardware.resolve_precision("auto") == "no" else "bf16"
        assert err.count("fp16 (train.mixed_precision) needs a CUDA GPU") == 1
        assert f"instead: {auto}" in err
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["max_steps"] == math.ceil(3 * 7 / 4)  # 7 rows after 1 held out
    assert saved["model"]["gradient_checkpointing"] and saved["lora"]["rank"] == 16
    assert (out / "final" / "adapter_model.safetensors").is_file()
    other = tmp_path / "by-train"
    args = ["--config", str(file), f"data.files=[{world['small']}]", f"train.output_dir={other}"]
    assert cli(["train", *args, "train.num_train_epochs=1"]) == 0
    assert yaml.safe_load((other / "config.yaml").read_text())["lora"]["alpha"] == 32


def test_dataset_class(world, seed_run, tmp_path):
    trainer = seed_run["trainer"]
    tok = trainer.tokenizer
    seq_len = trainer.config.data.seq_len
    data = ReasoningDataset(world["train"], tok, max_seq_length=seq_len)
    trained = trainer.result.data.train  # the rows the run trained on
    assert len(data) == len(trained) == 16
    for a, b in zip(data, trained, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    row = data[0]
    targets = tok.decode(row["input_ids"][row["labels"] != -100])
    assert targets.startswith(json.loads(world["train"].read_text())[0]["messages"][1]["content"])
    batch = data.collate([data[0], data[1]])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    for fmt in ("alpaca", "prompt_response"):
        other = ReasoningDataset(formatted(tmp_path / f"{fmt}.json", 5, fmt), tok, 160)
        assert len(other) == 5 and other.stats.supervised > 0
        assert all(len(r["input_ids"]) <= 160 for r in other)


def test_initialization(world, tmp_path):
    # Load configuration
    config = TrainingConfig(
        model_name_or_path=str(world["model"]),
        use_lora=True,
        load_in_4bit=True,
        num_train_epochs=3,
    )
    # Initialize trainer
    trainer = ModelTrainer(config)
    assert config.use_lora and config.load_in_4bit and config.num_train_epochs == 3
    assert trainer.config.model.source == "hf" and trainer.config.lora.enabled
    assert trainer.config.train.lr == 2e-4  # the fine-tuning default, as `finetune` takes it
    with pytest.raises(StackWiseError, match=r"call trainer.train\(\) first"):
        trainer.model  # noqa: B018
    with pytest.raises(StackWiseError, match=r"train\(train_file=FILE\)") as err:
        trainer.train()  # the rows come with train(); without them the run is refused
    one_paragraph(str(err.value))
    with pytest.raises(StackWiseError, match="fine-tunes a Hugging Face model"):
        ModelTrainer(TrainingConfig(learning_rate=1e-3))


def test_training(world, seed_run, monkeypatch):
    from bitsandbytes.nn import Linear4bit
    from peft import PeftModel

    monkeypatch.chdir(world["root"])  # where the run was started: its paths are relative
    trainer, final = seed_run["trainer"], Path(seed_run["final"])
    out = trainer.output_dir
    assert final == out / "final" and out.parent.name == "outputs"
    model = trainer.model  # loaded from the folder, 4-bit quantized, LoRA attached
    assert isinstance(model, PeftModel) and any(isinstance(m, Linear4bit) for m in model.modules())
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    assert trainer.tokenizer.chat_template  # the tokenizer, with its chat template
    steps = history(out)
    assert steps[-1]["step"] == 3 * math.ceil(16 / 16)  # three epochs of one batch of 16
    assert "loss" in steps[-1] and trainer.result.data.eval_chat.examples == 4  # the eval file
    saved = yaml.safe_load((out / "config.yaml").read_text())  # the training configuration
    assert saved["model"]["load_in_4bit"] and saved["lora"]["enabled"]
    gen = json.loads((out / "generation_config.json").read_text())  # generation parameters
    eos = gen["eos_token_id"]
    assert trainer.tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])
    names = {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"}
    assert names | {"generation_config.json", "tokenizer_config.json"} <= {
        p.name for p in final.iterdir()
    }
    for name in names:  # links to the run's own files, not second copies
        assert (final / name).stat().st_ino == (out / name).stat().st_ino


def test_lora_config(world, tmp_path):
    from peft import LoraConfig

    # LoRA configuration
    lora_config = LoraConfig(
        r=16,  # Rank of update matrices
        lora_alpha=32,  # Scaling factor
        lora_dropout=0.05,  # Dropout probability
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],  # Which modules to apply LoRA to
        bias="none",  # Whether to train bias parameters
        task_type="CAUSAL_LM",  # Task type
    )
    config = TrainingConfig(
        model_name_or_path=str(world["model"]), output_dir=str(tmp_path / "o"), max_steps=1
    )
    trainer = ModelTrainer(config, lora_config=lora_config)
    trainer.train(train_file=world["train"], eval_file=world["eval"])
    peft = trainer.model.peft_config["default"]
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (16, 32, 0.05)
    assert set(peft.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    adapted = {n.split(".")[-2] for n, _ in trainer.model.named_modules() if n.endswith("lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}
    ranks = {m.weight.shape[0] for n, m in trainer.model.named_modules() if "lora_A.default" in n}
    assert ranks == {16}
    with pytest.raises(StackWiseError, match="bias='all'") as err:
        ModelTrainer(config, lora_config=LoraConfig(bias="all"))
    one_paragraph(str(err.value))


def test_cli_single_gpu(world, tmp_path):
    out = tmp_path / "checkpoints" / "mistral-7b-reasoning"
    command = [
        sys.executable, "-m", "stackwise.fronts.model_trainer",
        "--model_name_or_path", str(world["model"]),
        "--train_file", str(world["small"]),
        "--output_dir", str(out),
        "--use_lora", "True",
        "--load_in_4bit", "True",
        "--num_train_epochs", "3",
        "--learning_rate", "2e-5",
        "--train_batch_size", "1",
        "--gradient_accumulation_steps", "4",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"the final model: {out / 'final'}" in done.stdout
    saved = yaml.safe_load((out / "config.yaml").read_text())
    tc = saved["train"]
    assert (tc["lr"], tc["batch_size"], tc["grad_accum_steps"]) == (2e-5, 1, 4)
    assert tc["max_steps"] == math.ceil(3 * 7 / 4) and saved["model"]["load_in_4bit"]
    assert (out / "final" / "adapter_config.json").is_file()


def test_cli_deepspeed(world, tmp_path):
    """The seed's DeepSpeed line, its flags as written: the config file is read (a setting
    that disagrees with train.* refused in one paragraph); the run itself, under the
    `deepspeed` launcher, is tests/test_deepspeed.py's."""
    pytest.importorskip("deepspeed", reason="the DeepSpeed extra is not installed")
    ds = write_json(tmp_path / "deepspeed_zero3.json", {"zero_optimization": {"stage": 3}})
    model = str(world["model"])
    config = TrainingConfig(model_name_or_path=model, load_in_4bit=True, deepspeed_config=str(ds))
    assert config.parallel.deepspeed_config == str(ds)
    from stackwise.plan_parallel import parallel_spec

    spec = parallel_spec(config, None)
    assert spec.name == "deepspeed" and spec.deepspeed["zero_optimization"]["stage"] == 3
    bad = write_json(tmp_path / "bad.json", {"train_micro_batch_size_per_gpu": 3})
    out = tmp_path / "checkpoints" / "llama-13b-reasoning"
    script = Path(stackwise.__file__).parent / "fronts" / "model_trainer.py"
    command = [
        sys.executable, str(script),
        "--model_name_or_path", model,
        "--train_file", str(world["train"]),
        "--output_dir", str(out),
        "--use_lora", "True",
        "--load_in_4bit", "True",
        "--num_train_epochs", "3",
        "--deepspeed_config", str(bad),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 2 and not out.exists()
    said = one_paragraph(done.stderr)
    assert "train_micro_batch_size_per_gpu: 3" in said and '"auto"' in said


def test_wandb(world, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    runs = []
    real_init = wandb.init

    def watched_init(**kw: Any) -> Any:
        runs.append(real_init(**kw))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", watched_init)
    out = tmp_path / "run"
    # Enable wandb tracking
    config = TrainingConfig(
        # ...other parameters...
        model_name_or_path=str(world["model"]),
        output_dir=str(out),
        max_steps=2,
        use_wandb=True,
        wandb_project="SimpleFoundation",
        wandb_name="mistral-7b-v0.1-reasoning",
    )
    ModelTrainer(config).train(train_file=world["train"], eval_file=world["eval"])
    (run,) = runs
    assert (run.name, run.project) == ("mistral-7b-v0.1-reasoning", "SimpleFoundation")
    (log,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    written = log.read_bytes()
    for said in (b"mistral-7b-v0.1-reasoning", b"train/loss", b"train/lr", b"val/loss"):
        assert said in written


def test_wandb_missing_says_how_to_install(world, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(StackWiseError, match="pip install wandb"):
        TrainingConfig(model_name_or_path=str(world["model"]), use_wandb=True)


def _lr_curve(world: dict[str, Path], out: Path, **keys: Any) -> list[float]:
    """The LR of each of 100 steps, from the scheduler the Trainer of these keys builds."""
    from stackwise.io.lock import release_run_folder
    from stackwise.pipeline import trainer_of

    config = TrainingConfig(**base_keys(world, out, max_steps=100, learning_rate=1e-3), **keys)
    trainer = trainer_of(config)
    release_run_folder(trainer.output_dir)
    factor = trainer.scheduler.lr_lambdas[0]
    return [1e-3 * factor(step) for step in range(101)]


def test_lr_scheduling(world, tmp_path):
    block = {"learning_rate": 2e-5, "warmup_ratio": 0.03, "lr_scheduler_type": "cosine"}
    file = write_json(tmp_path / "lr.json", {**base_keys(world, tmp_path / "o"), **block})
    tc = load_config(file).train
    assert (tc.lr, tc.warmup_ratio, tc.scheduler) == (2e-5, 0.03, "cosine")
    top = pytest.approx(1e-3)
    curves = {
        name: _lr_curve(world, tmp_path / name, lr_scheduler_type=name, **warm)
        for name, warm in [
            ("linear", {"warmup_ratio": 0.1}),
            ("cosine", {"warmup_ratio": 0.1}),
            ("constant", {}),
            ("constant_with_warmup", {"warmup_ratio": 0.1}),
            ("polynomial", {"warmup_ratio": 0.1}),
        ]
    }
    for name, lrs in curves.items():
        if name != "constant":  # warmup: from 0 up to the peak at step 10
            assert lrs[0] == 0 and lrs[5] == pytest.approx(5e-4) and lrs[10] == top, name
    lin, cos = curves["linear"], curves["cosine"]
    assert lin[55] == pytest.approx(5e-4) and lin[100] == 0  # straight down to zero
    assert lin[30] - lin[31] == pytest.approx(lin[80] - lin[81])
    assert cos[55] == pytest.approx(5e-4) and cos[100] == pytest.approx(0, abs=1e-12)
    assert cos[11] - cos[12] < lin[11] - lin[12] and cos[30] > lin[30]  # slow, then faster
    assert set(curves["constant"]) == {1e-3}
    assert all(lr == top for lr in curves["constant_with_warmup"][10:])
    poly = curves["polynomial"]
    assert all(a >= b for a, b in itertools.pairwise(poly[10:])) and poly[100] == 0


def test_precision(world, tmp_path, capsys):
    block = {"fp16": True, "bf16": False}
    out = tmp_path / "o"
    file = write_json(tmp_path / "p.json", {**base_keys(world, out, max_steps=2), **block})
    assert load_config(file).train.mixed_precision == "fp16"
    hardware._fp16_noted.clear()
    trainer = ModelTrainer(str(file))
    trainer.train()
    ran = trainer.result.trainer.accelerator.mixed_precision
    err = capsys.readouterr().err
    if torch.cuda.is_available():
        assert ran == "fp16"
    else:  # fp16 on a CPU: the precision auto picks there, said in one line, once
        assert ran == hardware.resolve_precision("auto")
        assert err.count("fp16 (train.mixed_precision) needs a CUDA GPU") == 1
    for off in ({"fp16": False, "bf16": False}, {"fp16": False}):  # as the seed's trainer: fp32
        data = {**base_keys(world, out), **off}
        assert load_config(write_json(tmp_path / "fp32.json", data)).train.mixed_precision == "no"


def test_early_stopping(world, tmp_path, capsys):
    block = {"early_stopping_patience": 5, "early_stopping_threshold": 0.01}
    out = tmp_path / "o"
    keys = base_keys(world, out, max_steps=30, eval_steps=1, learning_rate=1e-7)
    file = write_json(tmp_path / "stop.json", {**keys, **block})
    assert cli(["finetune", "--config", str(file)]) == 0
    evals = [h["step"] for h in history(out)]
    # the first eval sets the best; five more without a 0.01 gain in loss stop the run
    assert evals[-1] == evals[0] + 5 < 30
    assert "early stopping at step" in capsys.readouterr().out + (out / "metrics.jsonl").read_text()


def test_model_merging(world, seed_run, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    # Load base model
    base_model = AutoModelForCausalLM.from_pretrained(str(world["model"]))
    ids = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = base_model(input_ids=ids).logits
    # Load trained LoRA adapter
    adapter_path = str(world["root"] / seed_run["final"])  # the run's <output_dir>/final
    model = PeftModel.from_pretrained(base_model, adapter_path)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
    # Merge weights
    merged_model = model.merge_and_unload()
    # Save merged model
    merged_model.save_pretrained("final_merged_model")
    files = {p.name for p in (tmp_path / "final_merged_model").iterdir()}
    assert "config.json" in files and "adapter_config.json" not in files
    again = AutoModelForCausalLM.from_pretrained("final_merged_model")
    with torch.no_grad():
        got = again(input_ids=ids).logits
    assert torch.allclose(got, adapted, atol=1e-4) and not torch.allclose(got, plain, atol=1e-4)


# ---- every key of the seed's layout ----

# flat key -> (the value a test gives, what its key must then hold, other keys it needs)
VALUES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "model_name_or_path": ("MODEL", "MODEL", {}),
    "train_file": ("a.json", ["a.json"], {}),
    "eval_file": ("b.json", ["b.json"], {}),
    "dataset_dir": ("rows_dir", "rows_dir", {}),
    "dataset_name": ("org/rows", "org/rows", {}),
    "dataset_subset": ("main", "main", {"dataset_name": "org/rows"}),
    "dataset_split": ("test", "test", {"dataset_name": "org/rows"}),
    "use_lora": (False, False, {}),
    "load_in_4bit": (True, True, {}),
    "load_in_8bit": (True, True, {}),
    "gradient_checkpointing": (True, True, {}),
    "attn_implementation": ("eager", "eager", {}),
    "trust_remote_code": (True, True, {}),
    "num_train_epochs": (2, 2.0, {}),
    "max_steps": (7, 7, {}),
    "learning_rate": (5e-5, 5e-5, {}),
    "train_batch_size": (3, 3, {}),
    "per_device_train_batch_size": (3, 3, {}),
    "gradient_accumulation_steps": (4, 4, {}),
    "output_dir": ("out", "out", {}),
    "lora_r": (32, 32, {}),
    "lora_alpha": (64, 64.0, {}),
    "lora_dropout": (0.1, 0.1, {}),
    "lora_target_modules": ("q_proj", ["q_proj"], {}),
    "lora_lr": (1e-4, 1e-4, {}),
    "memory_lr": (1e-4, 1e-4, {"train": {"enabled_extensions": ["memory"]}}),
    "base_model_lr": (1e-5, 1e-5, {"lora": {"modules_to_save": ["lm_head"]}}),
    "loraplus_lr_ratio": (8.0, 8.0, {}),
    "use_dora": (True, True, {}),
    "use_rslora": (True, True, {}),
    "save_merged": (True, True, {}),
    "max_seq_length": (64, 64, {}),
    "packing": (True, True, {}),
    "chat_template": ("{{ x }}", "{{ x }}", {}),
    "train_on": ("all", "all", {}),
    "warmup_ratio": (0.1, 0.1, {}),
    "warmup_steps": (5, 5, {}),
    "weight_decay": (0.0, 0.0, {}),
    "max_grad_norm": (0.5, 0.5, {}),
    "lr_scheduler_type": ("linear", "linear", {}),
    "early_stopping_patience": (3, 3, {}),
    "early_stopping_threshold": (0.01, 0.01, {"early_stopping_patience": 3}),
    "eval_steps": (7, 7, {}),
    "save_steps": (5, 5, {}),
    "save_total_limit": (2, 2, {"save_steps": 5}),
    "logging_steps": (3, 3, {}),
    "seed": (7, 7, {}),
    "resume_from_checkpoint": ("latest", "latest", {"output_dir": "out"}),
    "use_wandb": (True, True, {}),
    "wandb_project": ("proj", "proj", {"use_wandb": True}),
    "wandb_name": ("name", "name", {}),
    "run_name": ("name", "name", {}),
    "fp16": (True, "fp16", {}),
    "bf16": (True, "bf16", {}),
    "distributed_strategy": ("fsdp", "fsdp", {}),
    "fsdp_sharding_strategy": ("HYBRID_SHARD", "hybrid_shard", {}),
    "deepspeed_config": ("DS_FILE", "DS_FILE", {}),
}
REFUSED: dict[str, str] = {}


def test_the_table_names_each_key_once():
    assert set(VALUES) | set(REFUSED) == set(LAYOUT.keys)


def test_lora_target_modules_keeps_all_linear_a_keyword(world):
    config = TrainingConfig(
        model_name_or_path=str(world["model"]), lora_target_modules="all-linear"
    )
    assert config.lora.target_modules == "all-linear"  # PEFT's word for every linear layer


@pytest.mark.parametrize("name", sorted(LAYOUT.keys))
def test_every_flat_key_lands_on_a_working_key(name, world):
    from stackwise.config.seed_view import get_path

    target = LAYOUT.keys[name].target
    model = str(world["model"])
    if name in REFUSED:
        with pytest.raises(StackWiseError, match=REFUSED[name]):
            TrainingConfig(model_name_or_path=model, **{name: "x"})
        return
    value, want, needs = VALUES[name]
    if name == "deepspeed_config":
        pytest.importorskip("deepspeed", reason="the DeepSpeed extra is not installed")
        ds = str(write_json(world["root"] / "zero.json", {"zero_optimization": {"stage": 2}}))
    value, want = (model if v == "MODEL" else ds if v == "DS_FILE" else v for v in (value, want))
    config = TrainingConfig(**{"model_name_or_path": model, name: value, **needs})
    assert get_path(config, target) == want
    plain = (
        TrainingConfig()
        if name == "model_name_or_path"
        else TrainingConfig(model_name_or_path=model)
    )
    assert get_path(plain, target) != want  # it changed
    assert getattr(config, name) == want  # and reads back under the seed's name
    flags = [f"--{name}", str(value)]
    if not needs and name != "model_name_or_path":  # the same key as a finetune flag
        cli_config = finetune_config(["--model_name_or_path", model, *flags])
        assert get_path(cli_config, target) == want
