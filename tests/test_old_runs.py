"""Runs written by main before the redesign of issue 29 (commit 9ec99c4, tests/fixtures) still
load, compute what they computed, and resume: saved configs go through the door, old stack
metadata (adapters as [rank, alpha, dtype] lists) is still read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stackwise.config import load_config
from stackwise.pipeline import train_from_config
from stackwise.runs import load_trained

OLD = Path(__file__).parent / "fixtures" / "main-9ec99c4"


@pytest.fixture
def old_runs(tmp_path, monkeypatch) -> Path:
    """A copy of the old runs (a resume writes into its run) with its relative corpus path."""
    shutil.copytree(OLD, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    return tmp_path / "old"


# The logits were recorded on an AMD Zen 4 (AVX-512). The clm run is plain fp32 and matches them
# to 1e-5 on both CPUs seen. The prog run's trunk is NF4, and bitsandbytes' CPU kernels for it
# differ by CPU family: on an AVX2-only EPYC its logits differ from the recording by up to 3.2e-3,
# while there every NF4 layer computes what its dequantized weight does, to 1e-6 (asserted
# below): the recording carries the other machine's kernel, not a loading difference.
ATOL = {"clm": 1e-5, "prog": 5e-3}


def logits(rack: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    t = torch.tensor([0.5, 0.5]) if getattr(rack, "uses_time", False) else None
    with torch.no_grad():
        return (rack(ids, None, t) if t is not None else rack(ids)).float()


def with_exact_linears(rack: torch.nn.Module) -> torch.nn.Module:
    """`rack` with each bitsandbytes 4-bit linear replaced by an fp32 nn.Linear holding the
    weight that layer dequantizes to."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbf

    for module in list(rack.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                # pinned to the dequantize-and-matmul path (stackwise.quant.layers), so its
                # weight was never repacked for bitsandbytes' bf16 CPU kernel
                assert not child.support_avx512bf16_for_cpu
                assert not getattr(child.weight.quant_state, "packing_format_for_cpu", False)
                exact = torch.nn.Linear(child.in_features, child.out_features, bias=False)
                weight = bnbf.dequantize_4bit(child.weight.data, child.weight.quant_state)
                exact.weight.data = weight.float()
                assert child.bias is None
                setattr(module, name, exact)
    return rack


@pytest.mark.parametrize("kind", ["clm", "prog"])
def test_an_old_run_loads_and_computes_what_it_computed(old_runs, kind):
    expected = load_file(str(old_runs / "expected_logits.safetensors"))
    plan, rack, tok = load_trained(old_runs / f"run-{kind}")
    assert plan.model.d_model == 16 and len(tok) == 300
    rack.eval()
    got = logits(rack, expected["ids"])
    assert torch.allclose(got, expected[kind], atol=ATOL[kind]), kind
    if kind == "prog":  # what the 4-bit trunk computes here is its weights' product, exactly
        exact = logits(with_exact_linears(rack), expected["ids"])
        assert torch.allclose(got, exact, atol=1e-6, rtol=0)


def test_an_old_qlora_stack_keeps_its_adapters(old_runs):
    from stackwise.quant.lora import adapter_names

    _, rack, _ = load_trained(old_runs / "run-prog")
    assert {"stack", "trunk"} <= adapter_names(rack.stacks[0])


def test_an_old_checkpoint_resumes(old_runs, tmp_path):
    run = old_runs / "run-clm"
    overrides = [
        "train.max_steps=6",
        "train.output_dir=run-clm-more",  # a finished run is resumed into a new folder
        f"train.resume_from_checkpoint={run / 'checkpoint-4'}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    config = load_config(run / "config.yaml", overrides)
    result = train_from_config(config, quiet=True)
    assert result.state.step == 6
    assert result.state.resumed_from is not None
    assert Path(result.state.resumed_from).name == "checkpoint-4"
    assert [h["step"] for h in result.state.history][:2] == [0, 2]  # the old history, kept
