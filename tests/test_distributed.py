"""`torchrun --nproc_per_node 2 -m stackwise.cli train`: two CPU processes (gloo) train one rack."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from multiproc import launch, tiny_run

from stackwise.runs import load_trained

STEPS, BATCH, SEQ_LEN, WORLD = 4, 4, 32, 2


def torchrun(
    root: Path, name: str, overrides: list[str] | None = None, **env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    base = [f"train.max_steps={STEPS}", f"train.batch_size={BATCH}", "sample.num_samples=1"]
    return tiny_run(root, name, WORLD, [*base, *(overrides or [])], torchrun=True, **env)


def check_one_run_in_two_processes(proc: subprocess.CompletedProcess, out: Path) -> None:
    report = f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert list(out.parent.rglob("model.safetensors")) == [out / "model.safetensors"]
    history = json.loads((out / "history.json").read_text())
    assert history["steps"] == STEPS
    # each optimizer step consumed one batch on each of the two ranks
    assert history["tokens_seen"] == STEPS * BATCH * SEQ_LEN * WORLD, report
    assert "device cpu" in proc.stdout
    # rank 0 alone reports, logs and samples
    assert proc.stdout.count("StackWise: clm rack") == 1, report
    assert proc.stdout.count("Saved the trained rack") == 1, report
    assert proc.stdout.count("--- sample 1 ---") == 1, report
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4], rows
    config, rack, _ = load_trained(out)  # the single checkpoint is whole and loadable
    assert config.train.max_steps == STEPS
    assert sum(p.numel() for p in rack.parameters()) > 0


def test_plain_torchrun_on_cpu_trains_one_model_in_two_processes(tmp_path):
    """Plain torchrun, no Accelerate env: the ranks must join one DDP run over gloo."""
    proc, out = torchrun(tmp_path, "run")
    check_one_run_in_two_processes(proc, out)


PROGRESSIVE = [
    "model.n_stacks=2",
    "model.blocks_per_stack=1",
    "objective.name=diffusion",
    "progressive.strategy=progressive",
    "progressive.steps_per_stack=3",
    "train.max_steps=600",
    "data.num_samples=16",
]


def check_progressive(proc: subprocess.CompletedProcess, out: Path) -> dict:
    report = f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, report
    history = json.loads((out / "progressive_history.json").read_text())
    stacks = history["stacks"]
    assert [s["steps"] for s in stacks] == [3, 3], report
    # every stage's step consumed one batch per rank
    assert all(s["tokens"] == 3 * BATCH * SEQ_LEN * WORLD for s in stacks), stacks
    assert proc.stdout.count("Saved the trained rack") == 1, report
    assert sorted(p.name for p in (out / "stacks").glob("*.safetensors")) == [
        "anchor.safetensors",
        "stack_0.safetensors",
        "stack_1.safetensors",
    ]
    _, rack, _ = load_trained(out)
    assert len(rack.stacks) == 2
    return stacks[1]


def test_progressive_growth_with_cache_under_torchrun(tmp_path):
    """Each rank caches its own shard of keys; stage 2 reads them back."""
    proc, out = torchrun(tmp_path, "grow", [*PROGRESSIVE, "progressive.cache.enabled=true"])
    second = check_progressive(proc, out)
    assert second["cache"]["hits"] > 0 and second["cache"]["misses"] > 0, second


def test_progressive_qlora_trunk_under_torchrun(tmp_path):
    """NF4 trunk + PEFT trunk adapters, wrapped in DDP: the adapters train on both ranks."""
    proc, out = torchrun(
        tmp_path,
        "qlora",
        [
            *PROGRESSIVE,
            "progressive.trunk_strategy=qlora",
            "lora.enabled=true",
            "lora.trunk_adapters=true",
            "quant.enabled=true",
        ],
    )
    check_progressive(proc, out)
    meta = json.loads((out / "stacks" / "stack_0.json").read_text())
    assert meta["storage"] == "nf4" and "trunk" in meta["adapters"], meta


def test_finetune_under_torchrun_normalizes_over_both_ranks(tmp_path):
    """Two ranks of batch 2 score the step's 4 examples as one process of batch 4 does: the
    loss is the mean over all targets of both ranks, not a mean of per-rank means."""
    from hf_fixtures import chat_file, tiny_hf

    model, chat = tiny_hf(tmp_path / "m"), chat_file(tmp_path / "c.jsonl", n=24)
    losses = []
    for world, batch in ((WORLD, 2), (1, 4)):
        out = tmp_path / f"w{world}"
        flags = [
            "finetune", "--model_name_or_path", str(model), "--train_file", str(chat),
            "--max_steps", "1", "--train_batch_size", str(batch), "--output_dir", str(out),
            "--bf16", "False", "logging.log_every=1", "sample.num_samples=0",
        ]  # fmt: skip
        proc = launch(world, flags, tmp_path, timeout=180, torchrun=world > 1)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        losses.append(next(r["train/loss"] for r in rows if "train/loss" in r))
        assert (out / "adapter_model.safetensors").is_file()
    assert abs(losses[0] - losses[1]) < 1e-5, losses
