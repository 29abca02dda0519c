"""The logits' way into the loss under autocast: stackwise's own losses take them in the
autocast dtype and upcast inside their kernel; a loss written outside stackwise gets fp32 ones
(Accelerate's contract). Both train to the same weights, bit for bit."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F

from stackwise.compiling import CompiledOrEager
from stackwise.model import Rack
from stackwise.objectives import CLM, build_objective
from stackwise.objectives.base import compiled_ce_sum, weighted_ce_sum
from stackwise.pipeline import trainer_for
from stackwise.train import builders
from stackwise.train.adapters import RackAdapter
from stackwise.train.compile_policy import c_compiler
from stackwise.train.extensions import Extension
from stackwise.train.strategy import TrainingStrategy
from tests.test_trainer import SP, blocks


class UsersAdapter(RackAdapter):
    """An adapter with its own loss (here: the same one), defined outside stackwise."""

    def loss(self, *args, **kwargs):
        return super().loss(*args, **kwargs)


class UsersStrategy(TrainingStrategy):
    """A step of one's own that reads the model's output itself."""

    seen: ClassVar[list[torch.dtype]] = []

    def compute_loss(self, model, batch):
        ctx = self.context
        prep = ctx.objective.prepare(batch, ctx.gen)
        logits = model(prep.inputs, prep.attention_mask)
        UsersStrategy.seen.append(logits.dtype)
        return F.cross_entropy(logits.flatten(0, 1), prep.targets.flatten(), ignore_index=-100)


class UsersProbe(Extension):
    """An extension of one's own that runs the model in a hook."""

    seen: ClassVar[list[torch.dtype]] = []

    def on_eval(self, run, metrics):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            UsersProbe.seen.append(run.model(torch.randint(4, 40, (1, 8))).dtype)


class UsersObjective(CLM):
    seen: ClassVar[list[torch.dtype]] = []

    def loss(self, logits, prep):
        UsersObjective.seen.append(logits.dtype)
        return super().loss(logits, prep)


def trained(cfg, adapter=None, objective=None, strategy=None, extensions=()):
    torch.manual_seed(0)
    rack = Rack(cfg.model, SP.vocab_size, cfg.objective.causal, cfg.masking.num_time_steps)
    parts = {"adapter": adapter} if adapter else {}
    parts |= {"strategy": strategy} if strategy else {}
    objective = objective or build_objective(cfg, SP)
    trainer = trainer_for(cfg, rack, objective, blocks(32), blocks(8), extensions, **parts)
    return trainer


def bf16_config(tiny, name: str):
    return tiny(
        train={
            "mixed_precision": "bf16",
            "max_steps": 2,
            "output_dir": str(tiny().train.output_dir) + name,
        }
    )


def test_own_loss_reads_bf16_logits_and_trains_as_the_fp32_path_does(tiny, bf16_autocast):
    seen: dict[str, torch.dtype] = {}
    runs = {}
    for name, adapter in (("own", None), ("users", UsersAdapter())):
        trainer = trained(bf16_config(tiny, name), adapter)
        objective = trainer.strategy.context.objective

        def record(logits, targets, weights, name=name):
            seen[name] = logits.dtype
            return weighted_ce_sum(logits, targets, weights)

        objective._ce_sum = record
        trainer.train()
        runs[name] = trainer.raw_model.state_dict()
    assert seen == {"own": torch.bfloat16, "users": torch.float32}
    for key, value in runs["own"].items():
        assert torch.equal(value, runs["users"][key]), key


def test_an_objective_loss_written_outside_stackwise_gets_fp32_logits(tiny, bf16_autocast):
    cfg = bf16_config(tiny, "users-objective")
    UsersObjective.seen.clear()
    trained(cfg, objective=UsersObjective(SP)).train()
    assert UsersObjective.seen and set(UsersObjective.seen) == {torch.float32}


def test_an_extension_of_ones_own_that_runs_the_model_gets_fp32(tiny, bf16_autocast):
    UsersProbe.seen.clear()
    trained(bf16_config(tiny, "users-probe"), extensions=[UsersProbe()]).train()
    assert UsersProbe.seen and set(UsersProbe.seen) == {torch.float32}


def test_a_step_of_ones_own_gets_fp32_logits_and_so_does_the_trained_model(tiny, bf16_autocast):
    UsersStrategy.seen.clear()
    trainer = trained(bf16_config(tiny, "users-step"), strategy=UsersStrategy())
    trainer.train()
    assert UsersStrategy.seen and set(UsersStrategy.seen) == {torch.float32}
    own = trained(bf16_config(tiny, "own-after"))
    own.train()  # its outputs were bf16 while it trained (above); after, fp32 as before
    assert own.unwrapped()(torch.randint(4, 40, (1, 8))).dtype == torch.float32


@pytest.mark.skipif(c_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_a_run_with_the_compiled_loss_trains_as_the_eager_one(tiny, monkeypatch):
    """The compiled loss inside a Trainer (on GPUs only by default; forced here), with
    gradient accumulation and evaluation: the same weights as the eager loss, to rounding."""
    weights = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        monkeypatch.setattr(builders, "loss_compiles", lambda on, device, c=compiled: c)
        cfg = tiny(
            train={
                "max_steps": 3,
                "grad_accum_steps": 2,
                "eval_every": 2,
                "output_dir": str(tiny().train.output_dir) + name,
            }
        )
        trainer = trained(cfg)
        uses = trainer.strategy.context.objective._ce_sum
        assert isinstance(uses, CompiledOrEager) is compiled
        trainer.train()
        weights[name] = trainer.raw_model.state_dict()
    for key, value in weights["eager"].items():
        torch.testing.assert_close(weights["compiled"][key], value, rtol=1e-4, atol=1e-5)


def test_fused_copies_the_objective_with_the_compiled_loss_and_leaves_a_users_alone():
    own = CLM(SP)
    fused = own.fused()
    assert fused is not own and fused._ce_sum is compiled_ce_sum(False)
    assert own._ce_sum is weighted_ce_sum  # the original is untouched (evaluation keeps it)
    users = UsersObjective(SP)
    assert users.fused() is users


@pytest.mark.skipif(c_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_loss_equals_the_eager_one(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 9, 37, generator=g)).to(dtype)
    targets = torch.randint(0, 37, (2, 9), generator=g)
    targets[0, :3] = -100
    weights = torch.rand(2, 9, generator=g) * (targets != -100)
    grads = []
    values = []
    for fn in (weighted_ce_sum, compiled_ce_sum()):
        x = logits.clone().requires_grad_(True)
        value = fn(x, targets, weights)
        value.backward()
        values.append(value)
        grads.append(x.grad)
    assert values[0].dtype == values[1].dtype == torch.float32
    torch.testing.assert_close(values[1], values[0], rtol=1e-6, atol=1e-5)
    # a bf16 gradient is rounded once, from fp32 values that may differ in the last bits
    close = {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 0}
    torch.testing.assert_close(grads[1], grads[0], **close)


def test_under_auto_a_compiler_failing_in_the_loss_falls_back_to_eager(capsys):
    from tests.test_auto_speed import failing_compiler

    assert compiled_ce_sum(True).fallback and not compiled_ce_sum(False).fallback
    assert CLM(SP).fused(fallback=True)._ce_sum is compiled_ce_sum(True)
    loss = CompiledOrEager(weighted_ce_sum, fallback=True)
    loss.fn = failing_compiler  # what inductor raises without OpenMP
    logits, targets = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    weights = torch.ones(2, 5)
    assert torch.equal(loss(logits, targets, weights), weighted_ce_sum(logits, targets, weights))
    assert loss.failed and "omp.h: not found" in capsys.readouterr().err
