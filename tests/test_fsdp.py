"""FSDP2 (parallel.strategy: fsdp) on two CPU processes: the same training as one process
and as DDP, DCP checkpoints that resume bit for bit and reshard, LoRA under sharding."""

from __future__ import annotations

import math
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import make_corpus, tiny_dict
from multiproc import clean_env, finished, launch, report, tiny_run, train_losses
from safetensors.torch import load_file

from stackwise.runs import load_trained

STEPS = ["train.max_steps=6", "train.save_steps=3", "logging.jsonl=true"]
FSDP = ["parallel.strategy=fsdp"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Reference runs of the tiny clm config, 6 steps, a checkpoint every 3: DDP and FSDP
    on 2 processes (batch 4 each), and one process with their global batch of 8."""
    root = tmp_path_factory.mktemp("fsdp")
    made = {
        "ddp": tiny_run(root, "ddp", 2, STEPS),
        "fsdp": tiny_run(root, "fsdp", 2, [*STEPS, *FSDP]),
        "one": tiny_run(root, "one", 1, [*STEPS, "train.batch_size=8"]),
    }
    for proc, out in made.values():
        finished(proc, out)
    return root, {name: out for name, (_, out) in made.items()}, made["fsdp"][0]


def close(a: dict[int, float], b: dict[int, float], tol: float = 1e-5) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol for k in a)


def test_fsdp_trains_as_one_process_and_as_ddp(runs):
    _root, out, proc = runs
    sharded = train_losses(out["fsdp"])
    assert len(sharded) == 3
    # the two ranks' batches of 4 are the one process's batch of 8 (rank r reads rows r::2)
    assert close(sharded, train_losses(out["one"])), (sharded, train_losses(out["one"]))
    assert close(sharded, train_losses(out["ddp"]), 1e-6)
    # rank 0 alone reports and samples; the final weights are whole and load as any run's
    assert proc.stdout.count("Saved the trained rack") == 1, report(proc)
    assert proc.stdout.count("--- sample 1 ---") == 1, report(proc)
    _, rack, _ = load_trained(out["fsdp"])
    whole = load_file(str(out["fsdp"] / "model.safetensors"))
    assert sum(v.numel() for v in whole.values()) == sum(p.numel() for p in rack.parameters())
    # checkpoints hold DCP shards (one part per rank), no gathered copy
    ckpt = out["fsdp"] / "checkpoint-3"
    assert (ckpt / "sharded" / ".metadata").is_file()
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2
    assert not (ckpt / "model.safetensors").exists() and not (ckpt / "optimizer.bin").exists()


@pytest.mark.parametrize(
    "layout",
    [
        ["parallel.sharding=shard_grad_op"],
        ["parallel.sharding=hybrid_shard", "parallel.shard_group_size=2"],
        ["parallel.sharding=no_shard"],
    ],
    ids=["shard_grad_op", "hybrid_shard", "no_shard"],
)
def test_every_sharding_layout_trains_as_ddp(runs, layout):
    root, out, _ = runs
    name = layout[0].split("=")[1]
    proc, run = tiny_run(root, name, 2, [*STEPS, *FSDP, *layout])
    finished(proc, run)
    assert close(train_losses(run), train_losses(out["ddp"]), 1e-6)


@pytest.mark.parametrize("dtype", ["param_dtype", "reduce_dtype"])
def test_bf16_gathers_or_reduces_in_bf16(runs, dtype):
    """param_dtype bf16 computes with bf16 copies of the fp32 shards, reduce_dtype bf16
    averages gradients in bf16: the losses move off the fp32 run's a little, and it learns."""
    root, out, _ = runs
    proc, run = tiny_run(root, dtype, 2, [*STEPS, *FSDP, f"parallel.{dtype}=bf16"])
    finished(proc, run)
    mixed, full = train_losses(run), train_losses(out["fsdp"])
    assert mixed != full
    assert all(math.isfinite(v) and abs(v - full[k]) < 0.05 for k, v in mixed.items())
    assert mixed[6] < mixed[2]


def test_cpu_offload_on_a_cpu_is_said_to_change_nothing(runs):
    """The shards already live on the CPU: the run trains as without it, and says so."""
    root, out, _ = runs
    proc, run = tiny_run(root, "offload", 2, [*STEPS, *FSDP, "parallel.cpu_offload=true"])
    finished(proc, run)
    assert "parallel.cpu_offload keeps the shards on the CPU" in proc.stderr
    assert proc.stderr.count("parallel.cpu_offload keeps") == 1  # rank 0 alone
    assert close(train_losses(run), train_losses(out["fsdp"]), 0.0)


def test_dcp_resume_is_bitwise_and_reshards_to_one_process(runs):
    root, out, _ = runs
    ckpt = str(out["fsdp"] / "checkpoint-3")
    resume = [*STEPS, f"train.resume_from_checkpoint={ckpt}"]
    proc, again = tiny_run(root, "again", 2, [*resume, *FSDP])
    finished(proc, again)
    first = load_file(str(out["fsdp"] / "model.safetensors"))
    second = load_file(str(again / "model.safetensors"))
    assert all(torch.equal(first[k], second[k]) for k in first)
    # 2 -> 1 process: the same weights and optimizer state, now whole on one process
    # under torchrun: a one-process run's interpreter teardown, which forked runs skip
    resharded = [*resume, *FSDP, "train.batch_size=8"]
    proc, one = tiny_run(root, "resharded", 1, resharded, torchrun=True)
    finished(proc, one)
    said = proc.stdout + proc.stderr
    assert "resharded: the checkpoint was written by 2 processes" in said
    assert "the epoch goes on from row 24 of its order" in said  # 3 steps x 4 rows x 2 ranks
    assert abs(train_losses(one)[6] - train_losses(out["fsdp"])[6]) < 1e-5


def test_a_sharded_checkpoint_resumes_under_ddp(runs):
    """DCP shards read back into whole DDP replicas: the run goes on as the sharded one."""
    root, out, _ = runs
    ckpt = str(out["fsdp"] / "checkpoint-3")
    proc, ddp = tiny_run(root, "to_ddp", 2, [*STEPS, f"train.resume_from_checkpoint={ckpt}"])
    finished(proc, ddp)
    assert abs(train_losses(ddp)[6] - train_losses(out["fsdp"])[6]) < 1e-6


def test_bf16_autocast_under_fsdp_matches_ddp(tmp_path):
    """train.mixed_precision bf16: the sharded forward autocasts as DDP's does (the gathers
    follow it in bf16), the loss is computed in fp32, and it learns."""
    losses = []
    for name, extra in (("ddp", []), ("fsdp", FSDP)):
        proc, run = tiny_run(tmp_path, name, 2, [*STEPS, "train.mixed_precision=bf16", *extra])
        finished(proc, run)
        assert "precision bf16" in proc.stdout, report(proc)
        losses.append(train_losses(run))
    assert close(*losses, 0.02), losses
    assert losses[1][6] < losses[1][2]


def test_diffusion_under_fsdp_trains_as_ddp(tmp_path):
    """Each rank draws its own masks (seeded by step and rank): FSDP and DDP draw the same."""
    diffusion = [*STEPS, "objective.name=diffusion"]
    losses = []
    for name, extra in (("ddp", []), ("fsdp", FSDP)):
        proc, run = tiny_run(tmp_path, name, 2, [*diffusion, *extra])
        finished(proc, run)
        losses.append(train_losses(run))
    assert close(*losses, 1e-6), losses


def test_lora_fine_tuning_under_fsdp_trains_only_the_adapters(tmp_path):
    """A tiny Hugging Face Llama with LoRA, two processes of batch 2 against one of batch 4
    (the seed's `--distributed_strategy fsdp` flag). The sharded checkpoint holds the
    adapters and their optimizer state alone (the frozen base reloads from its files, and
    the base it was trained on is recorded)."""
    from hf_fixtures import chat_file, tiny_hf
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    model, chat = tiny_hf(tmp_path / "m"), chat_file(tmp_path / "c.jsonl", n=24)
    losses = []
    for world in (2, 1):
        out = tmp_path / f"w{world}"
        flags = [
            "finetune", "--model_name_or_path", str(model), "--train_file", str(chat),
            "--max_steps", "2", "--train_batch_size", str(4 // world), "--output_dir",
            str(out), "--bf16", "False", "--distributed_strategy", "fsdp",
            "--fsdp_sharding_strategy", "FULL_SHARD", "--save_steps", "2",
            "logging.log_every=1", "sample.num_samples=0",
        ]  # fmt: skip
        proc = launch(world, flags, tmp_path)
        finished(proc, out)
        losses.append(train_losses(out))
        assert (out / "adapter_model.safetensors").is_file()
    assert close(*losses), losses
    checkpoint = tmp_path / "w2" / "checkpoint-2"
    saved = tmp_path / "state.pt"
    dcp_to_torch_save(checkpoint / "sharded", saved)
    state = torch.load(saved, weights_only=True)
    stepped = set(state["optim"]["state"])  # only the adapters have optimizer state
    assert stepped and all("lora_" in k for k in stepped), stepped
    # no frozen layer weight is written (the tied embedding/head may come along, unchanged)
    frozen = [k for k in state["model"] if "lora_" not in k]
    assert frozen in ([], ["base_model.model.lm_head.weight"]), frozen
    trained = [k for k in state["model"] if "lora_B" in k]
    assert trained and all(state["model"][k].abs().sum() > 0 for k in trained)  # B starts at 0
    assert (checkpoint / "base_model.json").is_file()


def test_two_nodes_meet_through_a_c10d_rendezvous(tmp_path):
    """docs/distributed.md's multi-node line on loopback: two torchrun agents (--nnodes 2,
    one process each) meet at a c10d rendezvous and shard one model between them."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(make_corpus(), encoding="utf-8")
    out = tmp_path / "nodes"
    config = tmp_path / "nodes.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(corpus, tmp_path / "cache", out)))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_id", "nodes",
             "--rdzv_endpoint", f"127.0.0.1:{port}", "-m", "stackwise.cli", "train",
             str(config), *STEPS, *FSDP]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    agents = [subprocess.Popen(agent, env=clean_env(), cwd=tmp_path, **pipes) for _ in range(2)]
    try:
        said = [agent.communicate(timeout=240) for agent in agents]
    finally:
        for running in agents:
            running.kill()  # no orphaned agent if one timed out
    assert [a.returncode for a in agents] == [0, 0], said
    assert "sharded by FSDP2 (full_shard) over 2 processes" in "".join(o for o, _ in said)
    assert len(list((out / "checkpoint-6" / "sharded").glob("*.distcp"))) == 2
    assert (out / "run_complete.json").is_file()
