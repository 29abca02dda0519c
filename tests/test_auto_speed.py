"""The speed settings' defaults decide by themselves and say what they chose: train.compile
auto (on for long single-process runs of plain racks, else off with the reason) and
train.fused_adamw auto (torch's fused kernel wherever it takes every parameter)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stackwise.config import ModelConfig
from stackwise.model import Rack
from stackwise.train import compile_policy
from stackwise.train.compile_policy import AUTO_MIN_STEPS, compile_decision, rack_blocker
from stackwise.train.optim import fused_kernel_takes


def rack(**kw) -> Rack:
    base = {"d_model": 32, "n_heads": 4, "n_stacks": 2, "blocks_per_stack": 1, "max_seq_len": 16}
    return Rack(ModelConfig(**{**base, **kw}), 40, True)


def test_a_setting_given_is_obeyed_whatever_the_run():
    assert compile_decision(True, "anything", 1, 8, "cpu").on
    assert not compile_decision(False, None, 10**6, 1, "cuda").on


def test_auto_compiles_a_long_single_process_run_of_a_plain_rack(monkeypatch):
    monkeypatch.setattr(compile_policy, "c_compiler", lambda: "g++")
    decided = compile_decision(None, rack_blocker(rack()), AUTO_MIN_STEPS, 1, "cpu")
    assert decided.on and "auto" in decided.note


@pytest.mark.parametrize(
    ("steps", "processes", "compiler", "reason"),
    [
        (AUTO_MIN_STEPS - 1, 1, "g++", "fewer than"),
        (AUTO_MIN_STEPS, 2, "g++", "distributed"),
        (AUTO_MIN_STEPS, 1, None, "C++ compiler"),
    ],
)
def test_auto_stays_eager_with_its_reason(monkeypatch, steps, processes, compiler, reason):
    monkeypatch.setattr(compile_policy, "c_compiler", lambda: compiler)
    decided = compile_decision(None, None, steps, processes, "cpu")
    assert not decided.on and reason in decided.note


def test_a_gpu_needs_no_c_compiler(monkeypatch):
    monkeypatch.setattr(compile_policy, "c_compiler", lambda: None)
    assert compile_decision(None, None, AUTO_MIN_STEPS, 1, "cuda").on


def test_racks_auto_does_not_compile_are_named():
    assert rack_blocker(rack()) is None
    assert "checkpointing" in rack_blocker(rack(gradient_checkpointing=True))
    adapted = rack()
    adapted.stacks[0].blocks[0].attn.q_proj = nn.Sequential(nn.Linear(32, 32))  # a wrapper
    assert "LoRA" in rack_blocker(adapted)
    assert rack_blocker(nn.Linear(2, 2)) == "no stacks to compile"


def test_fused_adamw_takes_plain_tensors_and_not_sharded_ones():
    plain = [nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    assert fused_kernel_takes(plain)
    sharded = nn.Parameter(torch.zeros(2))
    sharded._local_tensor = torch.zeros(1)  # what a DTensor carries
    assert not fused_kernel_takes([*plain, sharded])
    partitioned = nn.Parameter(torch.zeros(2))
    partitioned.ds_id = 0  # a DeepSpeed ZeRO parameter
    assert not fused_kernel_takes([partitioned])
    assert not fused_kernel_takes([])


def test_a_short_run_says_it_ran_eager_and_why(tiny, tmp_path, capsys):
    from stackwise.pipeline import train_from_config

    result = train_from_config(tiny(train={"max_steps": 2, "output_dir": str(tmp_path / "r")}))
    said = capsys.readouterr().out
    assert "eager (train.compile auto: 2 steps, fewer than" in said
    assert result.trainer.optimizer.optimizer.defaults.get("fused") is True  # fused by default


def test_a_sharding_parallelizer_keeps_the_fused_optimizer_off():
    from stackwise.spec import TrainSpec
    from stackwise.train.optim import build_optimizer

    groups = [{"params": [nn.Parameter(torch.zeros(2, 2))], "weight_decay": 0.0}]
    assert build_optimizer(groups, TrainSpec()).defaults.get("fused") is True
    assert not build_optimizer(groups, TrainSpec(), fused_may=False).defaults.get("fused")
    forced = TrainSpec(fused_adamw=True)
    assert build_optimizer(groups, forced, fused_may=False).defaults.get("fused") is True


def failing_compiler(*args):
    import torch._dynamo.exc as exc

    raise exc.BackendCompilerFailed(failing_compiler, RuntimeError("omp.h: not found"), None)


def test_a_compiler_failing_under_auto_falls_back_to_eager_and_says_so(capsys):
    from stackwise.model.compiled import compile_blocks, eager_on_compile_failure

    model = rack()
    ids = torch.randint(0, 40, (1, 6))
    expected = model(ids)
    compile_blocks(model)
    eager_on_compile_failure(model)
    model.stacks[0].fast.fn = failing_compiler  # what inductor raises without OpenMP
    assert torch.equal(model(ids), expected)
    assert "omp.h: not found" in capsys.readouterr().err
    assert model.stacks[1].fast.failed  # one shared switch: no second attempt


def test_a_compiler_failing_when_compile_was_asked_for_ends_the_run():
    import torch._dynamo.exc as exc

    from stackwise.model.compiled import compile_blocks

    model = rack()
    compile_blocks(model)
    model.stacks[0].fast.fn = failing_compiler
    with pytest.raises(exc.BackendCompilerFailed):
        model(torch.randint(0, 40, (1, 6)))
