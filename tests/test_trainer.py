"""The Trainer: accumulation, clipping, schedules, parameter groups, eval, logging, precision."""

from __future__ import annotations

import json
import math

import pytest
import torch

from stackwise.config import TrainConfig
from stackwise.data.pack import TokenBlocks
from stackwise.errors import StackWiseError
from stackwise.model import Rack
from stackwise.objectives import CLM, Specials, build_objective
from stackwise.pipeline import trainer_for
from stackwise.train import Trainer, build_param_groups, lr_factor
from stackwise.train.sampler import EpochSampler

SP = Specials(vocab_size=48, pad_id=0, mask_id=3, bos_id=1, eos_id=2)


def blocks(n: int, length: int = 32, seed: int = 0) -> TokenBlocks:
    g = torch.Generator().manual_seed(seed)
    # a learnable pattern: token i+1 follows i (mod 40), offset per row
    start = torch.randint(0, 40, (n, 1), generator=g)
    return TokenBlocks(4 + (start + torch.arange(length)) % 40)


def make_trainer(cfg, seed: int = 0, train_n: int = 64) -> Trainer:
    torch.manual_seed(seed)
    rack = Rack(cfg.model, SP.vocab_size, cfg.objective.causal, cfg.masking.num_time_steps)
    return trainer_for(cfg, rack, build_objective(cfg, SP), blocks(train_n), blocks(16, seed=1))


def test_gradient_accumulation_matches_one_big_batch(tiny):
    a = make_trainer(tiny(train={"batch_size": 8, "grad_accum_steps": 1, "max_steps": 3}))
    b = make_trainer(
        tiny(
            train={
                "batch_size": 4,
                "grad_accum_steps": 2,
                "max_steps": 3,
                "output_dir": str(a.output_dir) + "-b",
            }
        )
    )
    a.train()
    b.train()
    for (n, p), (_, q) in zip(
        a.raw_model.named_parameters(), b.raw_model.named_parameters(), strict=True
    ):
        assert torch.allclose(p, q, atol=2e-6), n
    assert a.state.tokens_seen == b.state.tokens_seen == 3 * 8 * 32


def test_gradients_are_clipped_to_max_grad_norm(tiny):
    tr = make_trainer(tiny(train={"max_grad_norm": 0.01, "max_steps": 2}))
    norms = []

    def record(opt, *_):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    tr.optimizer.optimizer.register_step_pre_hook(record)
    tr.train()
    assert norms and all(n <= 0.01 + 1e-6 for n in norms)
    tr2 = make_trainer(
        tiny(train={"max_grad_norm": 0, "max_steps": 1, "output_dir": str(tr.output_dir) + "-2"})
    )
    norms.clear()
    tr2.optimizer.optimizer.register_step_pre_hook(record)
    tr2.train()
    assert norms[0] > 0.01  # unclipped gradients are larger: the clip above did real work


@pytest.mark.parametrize(
    "name", ["linear", "cosine", "constant", "constant_with_warmup", "polynomial"]
)
def test_schedules_match_transformers(name):
    from transformers import get_scheduler

    warm = 0 if name == "constant" else 10
    extra = {"poly_power": 2.0} if name == "polynomial" else {}
    cfg = TrainConfig(scheduler=name, warmup_steps=warm, max_steps=100, **extra)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    kw = {"scheduler_specific_kwargs": {"power": 2.0, "lr_end": 0.0}} if extra else {}
    ref = get_scheduler(name, opt, num_warmup_steps=warm, num_training_steps=100, **kw)
    for step in range(100):
        assert lr_factor(step, cfg) == pytest.approx(ref.get_last_lr()[0], abs=1e-6), step
        opt.step()
        ref.step()


def test_min_lr_floor_and_warmup_ratio():
    cfg = TrainConfig(scheduler="cosine", warmup_ratio=0.1, max_steps=100, min_lr_ratio=0.2)
    assert lr_factor(5, cfg) == pytest.approx(0.5)
    assert lr_factor(99, cfg) == pytest.approx(0.2, abs=1e-3)
    assert min(lr_factor(s, cfg) for s in range(10, 100)) >= 0.2


def test_weight_decay_only_on_matrices_and_named_group_lrs(tiny):
    cfg = tiny(
        model={"tie_embeddings": False, "frozen_up_proj": True},
        train={"group_lr": {"embeddings": 0.01, "head": 0.005}, "lr": 0.001},
    )
    tr = make_trainer(cfg)
    groups = {g["name"]: g for g in tr.optimizer.param_groups}
    assert set(groups) == {"embeddings", "blocks", "blocks.no_decay", "head", "head.no_decay"}
    for name, g in groups.items():
        dims = {p.ndim for p in g["params"]}
        assert (dims == {1}) if name.endswith("no_decay") else (dims == {2})
        assert g["weight_decay"] == (0.0 if name.endswith("no_decay") else 0.1)
    assert groups["embeddings"]["initial_lr"] == 0.01
    assert groups["head"]["initial_lr"] == 0.005
    assert groups["blocks"]["initial_lr"] == 0.001
    frozen = tr.raw_model.stacks[0].blocks[0].ffn.up_proj.weight
    assert all(p is not frozen for g in groups.values() for p in g["params"])
    empty = build_param_groups({"time": []}, cfg.train)
    assert empty == []


def test_group_lr_changes_training(tiny):
    base = make_trainer(tiny(train={"max_steps": 2}))
    base.train()
    slow = make_trainer(
        tiny(
            train={
                "max_steps": 2,
                "group_lr": {"embeddings": 1e-9},
                "output_dir": str(base.output_dir) + "-s",
            }
        )
    )
    start = slow.raw_model.embed_tokens.weight.detach().clone()
    slow.train()
    moved_slow = (slow.raw_model.embed_tokens.weight - start).abs().max()
    torch.manual_seed(0)
    fresh = Rack(base.config.model, SP.vocab_size, True)
    moved_base = (base.raw_model.embed_tokens.weight - fresh.embed_tokens.weight).abs().max()
    assert moved_slow < 1e-7 < moved_base


@pytest.mark.parametrize("objective", ["clm", "mlm", "diffusion"])
def test_eval_reports_loss_perplexity_or_bound_and_accuracy(tiny, objective):
    tr = make_trainer(tiny(objective={"name": objective}))
    first, second = tr.evaluate(), tr.evaluate()
    assert first == second  # fixed batches and fixed masks: evals are comparable
    assert 0.0 <= first["accuracy"] <= 1.0
    if objective == "diffusion":
        assert first["ppl_bound"] == pytest.approx(math.exp(first["nelbo"]))
    else:
        assert first["ppl"] > 1.0


def test_training_lowers_val_loss_and_logs_everywhere(tiny):
    cfg = tiny(
        train={"max_steps": 40, "eval_every": 20, "lr": 3e-3},
        logging={"tensorboard": True, "log_every": 10},
    )
    tr = make_trainer(cfg)
    state = tr.train()
    losses = [h["loss"] for h in state.history]
    assert [h["step"] for h in state.history] == [0, 20, 40]
    assert losses[-1] < 0.7 * losses[0]
    rows = [json.loads(x) for x in (tr.output_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [10, 20, 30, 40]
    assert all(r["train/tokens_per_s"] > 0 for r in train_rows)
    assert all(r["train/lr"] > 0 for r in train_rows[:-1])  # cosine reaches 0 at the end
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tr.output_dir / "tensorboard"))
    acc.Reload()
    assert {"train/loss", "val/loss", "val/ppl"} <= set(acc.Tags()["scalars"])
    assert len(acc.Scalars("val/loss")) == 3


def test_bf16_autocast_runs_the_matmuls_in_bf16(tiny, bf16_autocast):
    seen = {}
    for mp in ("bf16", "no"):
        tr = make_trainer(
            tiny(
                train={
                    "mixed_precision": mp,
                    "max_steps": 1,
                    "output_dir": str(tiny().train.output_dir) + mp,
                }
            )
        )
        q = tr.raw_model.stacks[0].blocks[0].attn.q_proj
        q.register_forward_hook(lambda m, i, o, mp=mp: seen.__setitem__(mp, o.dtype))
        tr.train()
    assert seen == {"bf16": torch.bfloat16, "no": torch.float32}


def test_auto_precision_follows_the_probe_verdict_of_this_machine():
    """Whatever this CPU's verdict (each branch is forced in tests/test_hwprobe.py), `auto`
    gives bf16 exactly when the verdict says bf16 is fast, and an asked-for bf16 is kept."""
    from stackwise.hwprobe import ensure_bf16_ready
    from stackwise.train.hardware import make_accelerator, resolve_precision

    cpu = torch.device("cpu")
    verdict = ensure_bf16_ready()
    expected = "bf16" if verdict.bf16_fast else "no"
    assert resolve_precision("auto", cpu) == expected
    if verdict.works:
        assert resolve_precision("bf16", cpu) == "bf16"
    if not torch.cuda.is_available():
        assert make_accelerator("auto").mixed_precision == expected


def test_trainer_keeps_freed_memory_on_glibc():
    import ctypes.util
    import sys

    from stackwise.train.hardware import keep_freed_memory

    glibc = sys.platform.startswith("linux") and ctypes.util.find_library("c") is not None
    assert keep_freed_memory() is glibc


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 runs as asked on a GPU")
def test_fp16_on_cpu_runs_as_auto_and_says_so_once(tiny, capsys):
    """A CPU only emulates fp16 (about 100x slower): the run takes auto's choice, noted once."""
    from stackwise.train import hardware

    hardware._fp16_noted.clear()
    for _ in range(2):
        trainer = make_trainer(tiny(train={"mixed_precision": "fp16"}))
        assert trainer.accelerator.mixed_precision == hardware.resolve_precision("auto")
    assert capsys.readouterr().err.count("fp16 (train.mixed_precision) needs a CUDA GPU") == 1


def test_progress_bar_modes(tiny, capsys):
    make_trainer(tiny(logging={"progress_bar": "always"})).train()
    assert "train:" in capsys.readouterr().err
    make_trainer(tiny(logging={"progress_bar": "auto"})).train()  # stdout is not a TTY here
    assert "train:" not in capsys.readouterr().err


def test_console_logging_prints_metrics(tiny, capsys):
    make_trainer(tiny(logging={"console": True})).train()
    out = capsys.readouterr().out
    assert "train/loss=" in out and "val/loss=" in out


def test_refuses_to_overwrite_a_trained_model(tiny):
    cfg = tiny()
    out = make_trainer(cfg).output_dir
    (out / "model.safetensors").write_bytes(b"precious")
    with pytest.raises(StackWiseError, match="already holds a trained model"):
        make_trainer(cfg)
    assert (out / "model.safetensors").read_bytes() == b"precious"
    tr = make_trainer(tiny(train={"overwrite_output_dir": True}))
    tr.train()
    tr.save()
    assert (out / "model.safetensors").read_bytes() != b"precious"


def test_non_finite_loss_stops_with_the_step(tiny):
    class Exploding(CLM):
        calls = 0

        def loss(self, logits, prep):
            Exploding.calls += 1
            value = super().loss(logits, prep)
            return value * float("nan") if Exploding.calls > 2 else value

    cfg = tiny(train={"max_steps": 6}, logging={"log_every": 1})
    torch.manual_seed(0)
    tr = trainer_for(cfg, Rack(cfg.model, SP.vocab_size, True), Exploding(SP), blocks(64))
    with pytest.raises(StackWiseError, match="at step 3"):
        tr.train()


def test_sampler_covers_each_epoch_once_and_shards_by_rank():
    s0 = EpochSampler(10, seed=1, rank=0, world=2)
    s1 = EpochSampler(10, seed=1, rank=1, world=2)
    assert sorted(s0.order() + s1.order()) == list(range(10))
    first = s0.order()
    s0.epoch = 1
    assert s0.order() != first and sorted(s0.order() + EpochSampler(10, 1, 1, 2).order()) != []
    s0.start = 3
    assert list(s0) == s0.order()[3:]


def test_epochs_roll_over(tiny):
    tr = make_trainer(tiny(train={"max_steps": 5, "batch_size": 4}), train_n=8)
    tr.train()
    assert tr.state.epoch == 2 and tr.state.batch_in_epoch == 1
