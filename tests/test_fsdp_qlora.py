"""QLoRA under FSDP2 on two CPU processes: a rack with quantized linears and LoRA adapters,
and a Hugging Face model loaded in 4 bits, shard their frozen base (each 4-bit layer keeps its
statistics, so a gathered weight dequantizes), train only the adapters as one process or DDP
does, and resume bit for bit."""

from __future__ import annotations

import pytest
import torch
from multiproc import finished, launch, report, tiny_run, train_losses
from safetensors.torch import load_file

STEPS = ["train.max_steps=6", "train.save_steps=3", "logging.jsonl=true"]
FSDP = ["parallel.strategy=fsdp"]


def close(a, b, tol):
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol for k in a)


def equal_files(a, b):
    first, second = load_file(str(a)), load_file(str(b))
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("fmt", ["nf4", "fp8"])
def test_a_quantized_rack_with_lora_trains_under_fsdp_as_under_ddp(tmp_path, fmt):
    qlora = [*STEPS, "quant.enabled=true", f"quant.type={fmt}", "lora.enabled=true"]
    runs = {}
    for name, extra in (("ddp", []), ("fsdp", FSDP)):
        proc, runs[name] = tiny_run(tmp_path, name, 2, [*qlora, *extra])
        finished(proc, runs[name])
    sharded = train_losses(runs["fsdp"])
    assert len(sharded) == 3 and close(sharded, train_losses(runs["ddp"]), 1e-5)
    if fmt != "nf4":
        return
    # the final rack is whole, its 4-bit layers with their statistics, and loads as any run's
    from stackwise.runs import load_trained

    _, rack, _ = load_trained(runs["fsdp"])
    assert any(getattr(p, "quant_state", None) is not None for p in rack.parameters())
    # resumed from the sharded checkpoint at step 3: the same weights, bit for bit
    resume = [*qlora, *FSDP, f"train.resume_from_checkpoint={runs['fsdp'] / 'checkpoint-3'}"]
    proc, again = tiny_run(tmp_path, "again", 2, resume)
    finished(proc, again)
    assert equal_files(runs["fsdp"] / "model.safetensors", again / "model.safetensors")


def test_a_4bit_hugging_face_model_fine_tunes_under_fsdp_as_one_process(tmp_path):
    """`stackwise finetune --load_in_4bit True --distributed_strategy fsdp`: two processes of
    batch 2 against one of batch 4; the sharded checkpoint holds the adapters and their
    optimizer state alone (the base reloads and re-quantizes from its files), and a resume
    from it ends with the same adapters, bit for bit."""
    from hf_fixtures import chat_file, tiny_hf
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    model, chat = tiny_hf(tmp_path / "m"), chat_file(tmp_path / "c.jsonl", n=24)

    def finetune(world, out, *extra):
        flags = [
            "finetune", "--model_name_or_path", str(model), "--train_file", str(chat),
            "--max_steps", "4", "--train_batch_size", str(4 // world), "--output_dir",
            str(out), "--bf16", "False", "--load_in_4bit", "True", "--distributed_strategy",
            "fsdp", "--save_steps", "2", "logging.log_every=1", "sample.num_samples=0", *extra,
        ]  # fmt: skip
        proc = launch(world, flags, tmp_path)
        finished(proc, out)
        assert "4-bit" in proc.stdout, report(proc)
        return train_losses(out)

    two, one = finetune(2, tmp_path / "w2"), finetune(1, tmp_path / "w1")
    assert len(two) == 4 and close(two, one, 1e-5), (two, one)
    checkpoint = tmp_path / "w2" / "checkpoint-2"
    saved = tmp_path / "state.pt"
    dcp_to_torch_save(checkpoint / "sharded", saved)
    state = torch.load(saved, weights_only=True)
    assert set(state["optim"]["state"]) and all("lora_" in k for k in state["optim"]["state"])
    frozen = [k for k in state["model"] if "lora_" not in k]
    assert frozen in ([], ["base_model.model.lm_head.weight"]), frozen
    finetune(2, tmp_path / "again", "--resume_from_checkpoint", str(checkpoint))
    adapter = "adapter_model.safetensors"
    assert equal_files(tmp_path / "w2" / adapter, tmp_path / "again" / adapter)
