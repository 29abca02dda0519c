"""`torchrun --nproc_per_node 2 -m stackwise.cli train`: two CPU processes (gloo) train one rack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import make_corpus, tiny_dict

from stackwise.io.trained import load_trained

STEPS, BATCH, SEQ_LEN, WORLD = 4, 4, 32, 2


def torchrun(
    root: Path, name: str, overrides: list[str] | None = None, **env: str
) -> tuple[subprocess.CompletedProcess, Path]:
    corpus = root / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(make_corpus(), encoding="utf-8")
    out = root / name
    config = root / f"{name}.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(corpus, root / "cache", out)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(WORLD),
        "-m",
        "stackwise.cli",
        "train",
        str(config),
        f"train.max_steps={STEPS}",
        f"train.batch_size={BATCH}",
        "sample.num_samples=1",
        *(overrides or []),
    ]
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")},
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=full_env, timeout=180, check=False, cwd=root
    )
    return proc, out


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
