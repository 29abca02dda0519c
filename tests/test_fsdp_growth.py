"""Progressive growth under FSDP2 on two CPU processes: every stage trains a sharded copy of
its model (a cached frozen trunk gathered with the root; a frozen 4-bit trunk with adapters
and a trained trunk sharded by block), the same steps as DDP's, and a run stopped inside a
stage resumes from its shards."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from multiproc import finished, report, tiny_run, train_losses
from safetensors.torch import load_file

GROW = [
    "model.n_stacks=2",
    "model.blocks_per_stack=1",
    "objective.name=diffusion",
    "progressive.strategy=progressive",
    "progressive.steps_per_stack=4",
    "train.max_steps=600",
    "train.save_steps=2",
    "data.num_samples=16",
    "logging.jsonl=true",
]
FSDP = ["parallel.strategy=fsdp"]
LAYOUTS = {
    "cached_trunk": ["progressive.cache.enabled=true"],
    "qlora_trunk": [
        "progressive.trunk_strategy=qlora",
        "lora.enabled=true",
        "lora.trunk_adapters=true",
    ],
    "trained_trunk_fused": [
        "progressive.trunk_strategy=full",
        "progressive.mode=fused",
        "progressive.joint_tuning_steps=2",
    ],
}


def stage_losses(out, stages=("stack_0", "stack_1")):
    return {stage: train_losses(out / stage) for stage in stages}


def weights(out):
    return load_file(str(out / "model.safetensors"))


def close(a, b, tol):
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(abs(a[k][s] - b[k][s]) <= tol for s in a[k]) for k in a
    )


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    root = tmp_path_factory.mktemp("grow")
    proc, out = tiny_run(root, "fsdp", 2, [*GROW, *LAYOUTS["cached_trunk"], *FSDP])
    finished(proc, out)
    return root, proc, out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_stage_trains_under_fsdp_as_under_ddp(cached, tmp_path, layout):
    if layout == "cached_trunk":
        _root, proc, fsdp = cached
    else:
        proc, fsdp = tiny_run(tmp_path, "fsdp", 2, [*GROW, *LAYOUTS[layout], *FSDP])
        finished(proc, fsdp)
    ddp_proc, ddp = tiny_run(tmp_path, "ddp", 2, [*GROW, *LAYOUTS[layout]])
    finished(ddp_proc, ddp)
    assert "sharded by FSDP2 (full_shard) over 2 processes" in proc.stdout, report(proc)
    stages = ("stack_0", "stack_1", "joint") if "fused" in layout else ("stack_0", "stack_1")
    sharded, replicated = stage_losses(fsdp, stages), stage_losses(ddp, stages)
    assert all(len(v) >= 1 for v in sharded.values()), sharded
    assert close(sharded, replicated, 1e-5), (sharded, replicated)
    # the rack gathered back after each stage grew the next one and was saved whole
    a, b = weights(fsdp), weights(ddp)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    history = json.loads((fsdp / "progressive_history.json").read_text())
    if layout == "cached_trunk":  # each rank read its own cache behind the sharded stack
        assert history["stacks"][1]["cache"]["hits"] > 0, history["stacks"][1]
    # each stage's checkpoints hold DCP shards, one part per process
    shards = fsdp / "stack_1" / "checkpoint-2" / "sharded"
    assert len(list(shards.glob("*.distcp"))) == 2, sorted(fsdp.rglob("*"))


def test_a_run_stopped_inside_stage_two_resumes_from_its_shards(cached, tmp_path):
    """The run folder as a stop at step 2 of stage 2 leaves it: stage 1 finished (its stack
    file and history row), stage 2's sharded checkpoint. The resumed run regrows stage 1,
    resumes stage 2 from the shards and ends with the uninterrupted run's weights."""
    root, _, done = cached
    stopped = tmp_path / "stopped"
    shutil.copytree(done, stopped)
    for name in ("run_complete.json", "model.safetensors", "config.yaml"):
        (stopped / name).unlink()
    shutil.rmtree(stopped / "stack_1" / "checkpoint-4", ignore_errors=True)
    (stopped / "stack_1" / "latest").write_text("checkpoint-2")
    (stopped / "stacks" / "stack_1.safetensors").unlink()
    history = json.loads((stopped / "progressive_history.json").read_text())
    history["stacks"] = history["stacks"][:1]
    (stopped / "progressive_history.json").write_text(json.dumps(history))
    resume = [f"train.output_dir={stopped}", "train.resume_from_checkpoint=latest"]
    proc, _ = tiny_run(root, "stopped", 2, [*GROW, *LAYOUTS["cached_trunk"], *FSDP, *resume])
    finished(proc, stopped)
    assert "resuming after 1 finished stage(s) of 2" in proc.stdout, report(proc)
    first, again = weights(done), weights(stopped)
    assert all(torch.equal(first[k], again[k]) for k in first)
