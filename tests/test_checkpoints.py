"""Checkpoints: layout, atomic saves, rotation and best, early stopping, exact resume, NaN steps,
extensions, and the bad-input cases around them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from stackwise import register_extension
from stackwise.cli import main
from stackwise.data.pack import build_data
from stackwise.errors import StackWiseError
from stackwise.io.trained import build_rack
from stackwise.objectives import build_objective
from stackwise.pipeline import resolve_vocab, train_from_config, trainer_for
from stackwise.train import Trainer, finite
from stackwise.train.extensions import REGISTRY, Extension
from stackwise.train.finite import device_skips

CKPT_FILES = {
    "model.safetensors",
    "optimizer.bin",
    "scheduler.bin",
    "trainer_state.json",
    "rng_state_0.json",
    "config.yaml",
}


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class CrashAt(Extension):
    """Simulates a crash (after any checkpoint of that step was written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.state.step == self.step and trainer.config.train.save_steps == 0:
            raise KeyboardInterrupt

    def on_save(self, trainer: Trainer, path: Path) -> None:
        if trainer.state.step == self.step:
            raise KeyboardInterrupt


def make_trainer(cfg, extensions=None, train_data=None):
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    torch.manual_seed(cfg.train.seed)
    rack = build_rack(cfg, cfg.model.vocab_size)
    objective = build_objective(cfg, data.specials)
    return trainer_for(
        cfg, rack, objective, train_data or data.train, data.val, extensions=extensions or ()
    ), data


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}


# -- layout, atomicity, rotation ------------------------------------------------------------


def test_checkpoint_layout_and_safe_reading(tiny, tmp_path):
    out = tmp_path / "run"
    res = train_from_config(tiny(train={"save_steps": 2, "max_steps": 4}), quiet=True)
    assert res.output_dir == out
    for step in (2, 4):
        assert {p.name for p in (out / f"checkpoint-{step}").iterdir()} == CKPT_FILES
    assert (out / "latest").read_text().strip() == "checkpoint-4"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["batch_in_epoch"] == 2 and state["epoch"] == 0
    assert {"tokens_seen", "extensions", "stack_index", "history"} <= set(state)
    # the best eval so far, for readers (seed 001's best loss): from the history, not a report
    assert state["best_metric"] == min(r["loss"] for r in state["history"])
    opt = torch.load(out / "checkpoint-2" / "optimizer.bin", weights_only=True)
    assert opt["state"] and all("exp_avg" in s for s in opt["state"].values())
    final = load_file(str(out / "model.safetensors"))
    last = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert all(torch.equal(final[k], last[k]) for k in final)
    assert not list(out.glob(".checkpoint-*"))  # no temporary dirs left


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tiny, tmp_path, monkeypatch):
    """Disk full while writing checkpoint-4: a clear error, checkpoint-2 and `latest` intact."""
    import stackwise.io.files as ck

    cfg = tiny(train={"save_steps": 2, "max_steps": 6})
    real = ck.save_file
    calls = {"n": 0}

    def full_disk(state, path, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint
            raise OSError(28, "No space left on device")
        return real(state, path, metadata=metadata)

    monkeypatch.setattr(ck, "save_file", full_disk)
    with pytest.raises(StackWiseError, match=r"No space left on device.*previous checkpoints"):
        train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    assert (out / "latest").read_text().strip() == "checkpoint-2"
    assert {p.name for p in (out / "checkpoint-2").iterdir()} == CKPT_FILES
    assert not (out / "checkpoint-4").exists() and not list(out.glob(".checkpoint-*"))
    assert not (out / "model.safetensors").exists()


def test_rotation_keeps_the_limit_and_never_the_best(tiny, tmp_path):
    # greater_is_better on the loss makes the earliest (worst) checkpoint the "best" one
    cfg = tiny(
        train={
            "max_steps": 6,
            "save_steps": 1,
            "save_total_limit": 2,
            "eval_every": 1,
            "save_best_model": True,
            "greater_is_better": True,
        }
    )
    res = train_from_config(cfg, quiet=True)
    out = res.output_dir
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    best = state["extensions"]["best_model"]["checkpoint"]
    assert best == "checkpoint-0"  # the untrained rack, evaluated before step 1
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-6"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    reported = [r["report/best_metric"] for r in rows if "report/best_metric" in r]
    assert reported[-1] == state["extensions"]["best_model"]["best"]


def test_early_stopping_stops_and_says_why(tiny, capsys):
    cfg = tiny(
        train={
            "max_steps": 40,
            "eval_every": 2,
            "early_stopping_patience": 2,
            "early_stopping_threshold": 100.0,  # no improvement is ever large enough
        }
    )
    res = train_from_config(cfg, quiet=True)
    assert res.state.step == 4  # evals at 2 and 4 fail to improve on step 0's
    assert "early stopping at step 4" in capsys.readouterr().out


def test_best_model_follows_the_chosen_metric(tiny):
    cfg = tiny(
        train={
            "max_steps": 6,
            "eval_every": 2,
            "save_best_model": True,
            "metric_for_best": "accuracy",
        }
    )
    trainer, _ = make_trainer(cfg)
    state = trainer.train()
    assert trainer.greater_is_better  # the default for accuracy
    best = next(e for e in trainer.extensions if e.name == "best_model")
    accs = [h["accuracy"] for h in state.history]
    assert best.best == max(accs)
    assert best.best_step == state.history[accs.index(max(accs))]["step"]


def test_a_fresh_start_never_mixes_with_an_unfinished_run(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    REGISTRY["crash_at_2"] = lambda: CrashAt(2)
    try:
        crashing = cfg.model_copy(
            update={"train": cfg.train.model_copy(update={"enabled_extensions": ["crash_at_2"]})}
        )
        with pytest.raises(KeyboardInterrupt):
            train_from_config(crashing, quiet=True)
    finally:
        del REGISTRY["crash_at_2"]
    out = tmp_path / "run"
    before = tree_bytes(out)
    with pytest.raises(StackWiseError, match="unfinished run"):
        train_from_config(cfg, quiet=True)
    assert tree_bytes(out) == before
    over = cfg.model_copy(
        update={"train": cfg.train.model_copy(update={"overwrite_output_dir": True})}
    )
    res = train_from_config(over, quiet=True)
    assert res.state.step == 4 and res.trainer.resumed_from is None
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


@pytest.mark.parametrize(
    ("train", "match"),
    [
        ({"save_steps": 9, "max_steps": 4}, "no checkpoint would ever be written"),
        ({"enabled_extensions": ["early_stopping"]}, "built-in"),
        ({"save_total_limit": 2}, "none are written"),
        ({"metric_for_best": "accuracy"}, "save_best_model and early stopping"),
    ],
)
def test_checkpoint_settings_that_would_do_nothing_are_refused(tiny, train, match):
    with pytest.raises(StackWiseError, match=match):
        tiny(train=train)


# -- exact resume ---------------------------------------------------------------------------


def resume_pair(tiny, tmp_path, **sections):
    """(uninterrupted final weights, crashed-at-4-then-resumed final weights)."""
    train = {"max_steps": 8, "save_steps": 4, **sections.pop("train", {})}
    full = tiny(train={**train, "output_dir": str(tmp_path / "full")}, **sections)
    a = train_from_config(full, quiet=True)
    crashed = tiny(train={**train, "output_dir": str(tmp_path / "crash")}, **sections)
    REGISTRY["crash_at_4"] = lambda: CrashAt(4)
    try:
        crashed = crashed.model_copy(
            update={
                "train": crashed.train.model_copy(update={"enabled_extensions": ["crash_at_4"]})
            }
        )
        with pytest.raises(KeyboardInterrupt):
            train_from_config(crashed, quiet=True)
    finally:
        del REGISTRY["crash_at_4"]
    assert not (tmp_path / "crash" / "model.safetensors").exists()
    resumed = tiny(
        train={**train, "output_dir": str(tmp_path / "crash"), "resume_from_checkpoint": "latest"},
        **sections,
    )
    b = train_from_config(resumed, quiet=True)
    return a, b


def test_exact_resume_is_bitwise_for_clm_with_dropout(tiny, tmp_path):
    a, b = resume_pair(tiny, tmp_path, model={"dropout": 0.1}, train={"grad_accum_steps": 2})
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert b.trainer.resumed_from.name == "checkpoint-4"
    assert a.state.history == b.state.history  # same evals, same numbers
    rows = [json.loads(x) for x in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "val/loss" in r]
    assert steps == sorted(set(steps))  # no duplicated rows after the resume


def test_sampler_position_is_restored_without_reading_skipped_batches(tiny, tmp_path):
    class Counting(torch.utils.data.Dataset):
        def __init__(self, inner):
            self.inner, self.reads = inner, 0

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            self.reads += 1
            return self.inner[i]

    cfg = tiny(train={"max_steps": 6, "save_steps": 3, "batch_size": 4})
    first, data = make_trainer(cfg, extensions=[CrashAt(3)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    again = cfg.model_copy(
        update={"train": cfg.train.model_copy(update={"resume_from_checkpoint": "latest"})}
    )
    counting = Counting(data.train)
    second, _ = make_trainer(again, train_data=counting)
    second.train()
    assert second.state.step == 6
    assert counting.reads == 3 * 4  # only the 3 remaining batches were read


def test_resuming_with_data_that_gives_another_tokenizer_is_refused(tiny, tmp_path):
    """A resumed run whose data settings now build another BPE of the same size (here one
    learnt from a sample: a corpus over data.bpe_sample_mb after that key's arrival) is refused
    before it trains, and its folder keeps its tokenizer and checkpoints."""
    train = {"max_steps": 8, "save_steps": 4, "output_dir": str(tmp_path / "crash")}
    REGISTRY["crash_at_4"] = lambda: CrashAt(4)
    try:
        crashed = tiny(train={**train, "enabled_extensions": ["crash_at_4"]})
        with pytest.raises(KeyboardInterrupt):
            train_from_config(crashed, quiet=True)
    finally:
        del REGISTRY["crash_at_4"]
    before = tree_bytes(tmp_path / "crash")
    sampled = {"bpe_sample_mb": 0.003}
    other = tiny(train={**train, "resume_from_checkpoint": "latest"}, data=sampled)
    with pytest.raises(StackWiseError, match="is not the one its data settings give now"):
        train_from_config(other, quiet=True)
    assert tree_bytes(tmp_path / "crash") == before
    elsewhere = {**train, "output_dir": str(tmp_path / "new")}  # resumed into a new folder
    checkpoint = str(tmp_path / "crash" / "checkpoint-4")
    moved = tiny(train={**elsewhere, "resume_from_checkpoint": checkpoint}, data=sampled)
    with pytest.raises(StackWiseError, match="is not the one its data settings give now"):
        train_from_config(moved, quiet=True)
    same = tiny(train={**train, "resume_from_checkpoint": "latest"})
    assert train_from_config(same, quiet=True).state.step == 8  # the same data resumes
    # starting over in the folder is no resume: the new data's tokenizer replaces the old one
    fresh = tiny(train={**train, "overwrite_output_dir": True}, data=sampled)
    assert train_from_config(fresh, quiet=True).state.step == 8


def test_resume_bad_inputs_touch_nothing(tiny, tmp_path, capsys):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    before = tree_bytes(out)
    config = tmp_path / "c.yaml"
    base = cfg.model_dump(mode="json")
    base["train"]["output_dir"] = str(tmp_path / "again")

    def run_cli(data, *extra):
        config.write_text(yaml.safe_dump(data))
        code = main(["train", str(config), *extra])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and err.count("stackwise: error:") == 1, err
        return " ".join(err.split())

    # no latest pointer in the run dir
    assert "no 'latest' pointer" in run_cli(base, "train.resume_from_checkpoint=latest")
    # another model shape
    other = json.loads(json.dumps(base))
    other["model"]["d_model"] = 64
    msg = run_cli(other, f"train.resume_from_checkpoint={out / 'checkpoint-2'}")
    assert "another model shape" in msg or "shape mismatch" in msg
    # a truncated weights file (in a copy: the original must stay intact)
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(out / "checkpoint-2", broken / "checkpoint-2")
    w = broken / "checkpoint-2" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    assert "corrupted or truncated" in run_cli(
        base, f"train.resume_from_checkpoint={broken / 'checkpoint-2'}"
    )
    # a pickle bomb in place of the optimizer state is refused, not executed
    shutil.copytree(out / "checkpoint-2", broken / "evil")
    (broken / "evil" / "optimizer.bin").write_bytes(
        b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94."
    )
    assert "cannot be read safely" in run_cli(
        base, f"train.resume_from_checkpoint={broken / 'evil'}"
    )
    assert tree_bytes(out) == before


# -- NaN / inf ------------------------------------------------------------------------------


def poison_step(trainer: Trainer, step: int) -> Trainer:
    """Makes the loss of step `step` NaN (only that step)."""
    real = trainer.strategy.compute_loss

    def poisoned(model, batch):
        loss = real(model, batch)
        return loss * math.nan if trainer.state.step == step - 1 else loss

    trainer.strategy.compute_loss = poisoned  # type: ignore[method-assign]
    return trainer


@pytest.fixture(params=["device-verdict", "host-verdict", "host-unfused"])
def verdict(request, monkeypatch):
    """How a NaN step is found (stackwise.train.finite): on a GPU the fused AdamW skips it on
    a device flag that the host reads a step later (forced here on the CPU, which reads it at
    once); without the fused kernel the host decides."""
    if request.param == "device-verdict":
        monkeypatch.setattr(finite, "verdict_stays_on_device", lambda opt, dev: device_skips(opt))
    return request.param


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tiny, tmp_path, verdict):
    fused = verdict != "host-unfused"
    cfg = tiny(train={"max_steps": 6, "save_steps": 2, "fused_adamw": fused})
    trainer = poison_step(make_trainer(cfg)[0], 3)
    assert device_skips(trainer.optimizer) is fused
    with pytest.raises(StackWiseError, match="NaN/inf at step 3"):
        trainer.train()
    out = tmp_path / "run"
    assert (out / "latest").read_text().strip() == "checkpoint-2"
    saved = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in saved.values())


def weights_and_moments(trainer: Trainer) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in trainer.raw_model.named_parameters():
        out[name] = p.detach().clone()
        out.update({f"{name}.{k}": v.clone() for k, v in trainer.optimizer.state[p].items()})
    return out


@pytest.mark.parametrize(("log_every", "accumulate"), [(1, 1), (4, 1), (1, 2)])
def test_skip_nonfinite_steps_skips_the_update(tiny, verdict, log_every, accumulate):
    """The skipped step changes no weight and no optimizer moment, is counted by the next log
    line (read late, with log_every 4), and is left out of that line's mean loss."""
    train = {
        "max_steps": 6,
        "skip_nonfinite_steps": True,
        "fused_adamw": verdict != "host-unfused",
        "grad_accum_steps": accumulate,
    }
    trainer = poison_step(make_trainer(tiny(train=train, logging={"log_every": log_every}))[0], 3)
    before: dict[str, torch.Tensor] = {}
    after: dict[str, torch.Tensor] = {}
    poisoned, real_step = trainer.strategy.compute_loss, trainer.optimizer_step

    def snapshot(model, batch):
        if trainer.state.step == 2:  # step 3 is about to run: what it must leave alone
            before.update(weights_and_moments(trainer))
        return poisoned(model, batch)

    def step(batches):
        loss = real_step(batches)
        if trainer.state.step == 3:
            after.update(weights_and_moments(trainer))
        return loss

    trainer.strategy.compute_loss = snapshot  # type: ignore[method-assign]
    trainer.optimizer_step = step  # type: ignore[method-assign]
    state = trainer.train()
    assert state.step == 6 and trainer.skipped_steps == 1
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped().parameters())
    rows = [
        json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()
    ]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses and all(math.isfinite(v) for v in losses)
    assert [r.get("train/skipped_steps", 0) for r in rows if "train/loss" in r][-1] == 1


# -- extensions -----------------------------------------------------------------------------


@register_extension("hook_recorder")
class HookRecorder(Extension):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.steps_seen = 0

    def on_train_begin(self, trainer):
        self.calls.append("train_begin")

    def on_step_begin(self, trainer):
        self.calls.append("step_begin")

    def on_step_end(self, trainer):
        self.steps_seen += 1
        self.calls.append("step_end")

    def on_eval(self, trainer, metrics):
        assert "loss" in metrics
        self.calls.append("eval")

    def on_save(self, trainer, path):
        assert path.is_dir()
        self.calls.append("save")

    def on_train_end(self, trainer):
        self.calls.append("train_end")

    def state_dict(self):
        return {"steps_seen": self.steps_seen}

    def load_state_dict(self, state):
        self.steps_seen = state["steps_seen"]


def test_extensions_by_name_get_every_hook_and_their_state_is_checkpointed(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2, "enabled_extensions": ["hook_recorder"]})
    trainer, _ = make_trainer(cfg)
    trainer.train()
    rec = next(e for e in trainer.extensions if isinstance(e, HookRecorder))
    assert rec.calls[0] == "train_begin" and rec.calls[-1] == "train_end"
    assert rec.calls.count("step_begin") == rec.calls.count("step_end") == 4
    assert rec.calls.count("save") == 2 and rec.calls.count("eval") >= 2
    state = json.loads((tmp_path / "run" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["extensions"]["hook_recorder"] == {"steps_seen": 2}
    # the loggers and the progress bar are the MetricsLogger's sinks, beside the extensions
    assert "hook_recorder" in [e.name for e in trainer.extensions]
    assert {"progress_bar", "jsonl"} <= {s.name for s in trainer.metrics.sinks}
    with pytest.raises(StackWiseError, match=r"not registered.*hook_recorder"):
        make_trainer(tiny(train={"enabled_extensions": ["nope"]}))


def test_wandb_logs_offline(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    res = train_from_config(
        tiny(
            train={"max_steps": 4},
            logging={"log_to_wandb": True, "log_every": 1, "wandb_project": "proj-x"},
        ),
        quiet=True,
    )
    runs = list((res.output_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    data = list(runs[0].glob("*.wandb"))
    assert data and data[0].stat().st_size > 0
    # the run's protobuf log holds every logged key: 4 train rows (log_every 1), 3 evals
    raw = data[0].read_bytes()
    assert raw.count(b"train/loss") >= 4 and raw.count(b"val/loss") >= 3
    assert b"proj-x" in raw


# -- progressive resume ---------------------------------------------------------------------


class CrashInStage(Extension):
    """Crash in stage `stage`: after its checkpoint at `step`, or (step None) once it ended."""

    def __init__(self, stage: int, step: int | None) -> None:
        self.stage, self.step = stage, step

    def on_save(self, trainer, path):
        if getattr(trainer, "stack_index", None) == self.stage and trainer.state.step == self.step:
            raise KeyboardInterrupt

    def on_stack_end(self, trainer, index, record):
        if self.step is None and index == self.stage:
            raise KeyboardInterrupt


def crash_then_resume(cfg: Any, stage: int, step: int | None) -> Any:
    """Run cfg("crash") until CrashInStage(stage, step) stops it, then resume it to the end."""
    REGISTRY["crash_in_stage"] = lambda: CrashInStage(stage, step)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_from_config(cfg("crash", enabled_extensions=["crash_in_stage"]), quiet=True)
    finally:
        del REGISTRY["crash_in_stage"]
    return train_from_config(cfg("crash", resume_from_checkpoint="latest"), quiet=True)


@pytest.mark.parametrize(("stage", "step"), [(1, 2), (0, None)], ids=["mid-stack", "between"])
def test_progressive_diffusion_resumes_bitwise(tiny, tmp_path, stage, step):
    from test_progressive import grown

    def cfg(name, **train):
        return grown(
            tiny,
            3,
            {"steps_per_stack": 4},
            model={"dropout": 0.1},
            train={"save_steps": 2, "output_dir": str(tmp_path / name), **train},
        )

    full = train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, stage, step)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    assert [r.eval for r in full.progressive.stacks] == [r.eval for r in resumed.progressive.stacks]
    assert full.progressive.final_eval == resumed.progressive.final_eval


def test_progressive_resume_with_cache_rebuilds_it(tiny, tmp_path):
    from test_progressive import grown

    def cfg(**train):
        return grown(
            tiny,
            3,
            {"steps_per_stack": 4, "cache": {"enabled": True}},
            train={"save_steps": 2, "output_dir": str(tmp_path / "c"), **train},
            data={"num_samples": 16},
        )

    REGISTRY["crash_in_stage"] = lambda: CrashInStage(2, 2)
    try:
        with pytest.raises(KeyboardInterrupt):
            train_from_config(cfg(enabled_extensions=["crash_in_stage"]), quiet=True)
    finally:
        del REGISTRY["crash_in_stage"]
    res = train_from_config(cfg(resume_from_checkpoint="latest"), quiet=True)
    last = res.progressive.stacks[2]
    assert last.steps == 4 and last.cache["misses"] > 0  # the cache was refilled
    assert math.isfinite(res.progressive.final_eval["nelbo"])


def test_diffusion_evals_score_the_same_noise_after_a_resume(tiny, tmp_path):
    """The eval's t draws and masks come from the run's seed and the batch index, never from
    the training RNG, so a resumed diffusion run reports exactly the uninterrupted run's evals."""
    a, b = resume_pair(tiny, tmp_path, objective={"name": "diffusion"})
    assert a.state.history == b.state.history
    assert all("bpc" in h and "nelbo" in h for h in a.state.history)


class HookOrder(Extension):
    """Records hook order, and whether the stage's TensorBoard writer is still open."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int | None, bool]] = []

    def _writer_open(self, trainer) -> bool:
        tb = [e for e in trainer.sinks if type(e).__name__ == "TensorBoardSink"]
        return bool(tb) and tb[0].writer is not None

    def on_stack_end(self, trainer, index, record):
        self.seen.append(("stack_end", index, self._writer_open(trainer)))

    def on_train_end(self, trainer):
        self.seen.append(("train_end", getattr(trainer, "stack_index", None), False))


def test_on_stack_end_comes_before_the_stage_closes_its_loggers(tiny):
    """Each stage reports its stack while TensorBoard/W&B are still open, then closes them."""
    from test_progressive import grown

    order = HookOrder()
    REGISTRY["hook_order"] = lambda: order
    try:
        train_from_config(
            grown(
                tiny,
                2,
                {"steps_per_stack": 2},
                train={"enabled_extensions": ["hook_order"]},
                logging={"tensorboard": True},
            ),
            quiet=True,
        )
    finally:
        del REGISTRY["hook_order"]
    stages = [(kind, index) for kind, index, _ in order.seen]
    assert stages == [("stack_end", 0), ("train_end", 0), ("stack_end", 1), ("train_end", 1)]
    assert all(open_ for kind, _, open_ in order.seen if kind == "stack_end")


# -- saved runs through the door (stackwise.runs) -------------------------------------------


def older_layout(path: Path) -> None:
    """Rewrite a saved config.yaml as an earlier StackWise (or a hand) wrote it: the seeds' flat
    names where they have one, and the keys added since left out."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    train = data["train"]
    data["eval_steps"] = train.pop("eval_every")  # key aliases, at the top level
    data["mixed_precision"] = train.pop("mixed_precision")
    data["enabled_extensions"] = train.pop("enabled_extensions")
    for newer in ("attention_bias", "frozen_up_proj", "moe"):
        data["model"].pop(newer)
    data.pop("memory")
    path.write_text(yaml.safe_dump(data), encoding="utf-8")


def test_a_run_saved_in_an_older_layout_loads_and_resumes_through_the_door(tiny, tmp_path):
    from stackwise.io.checkpoints import check_resume_config
    from stackwise.io.final import MARKER
    from stackwise.plan import compile_plan
    from stackwise.runs import load_trained

    cfg = tiny(train={"max_steps": 2, "save_steps": 2})
    train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    ckpt = out / "checkpoint-2"
    for path in (out / "config.yaml", ckpt / "config.yaml"):
        older_layout(path)
    for folder in (out, ckpt):
        plan, rack, _ = load_trained(folder)
        assert plan.train.eval_every == 2 and plan.train.mixed_precision == "no"
        assert plan.model.attention_bias is False and not plan.memory_on
        saved = load_file(folder / "model.safetensors")
        assert all(torch.equal(v, saved[k]) for k, v in rack.state_dict().items())
    step = json.loads((ckpt / "trainer_state.json").read_text())["step"]
    running = compile_plan(cfg).with_section("model", vocab_size=plan.model.vocab_size)
    assert check_resume_config(ckpt, running, step) is None
    with pytest.raises(StackWiseError, match=r"model.n_heads 2 -> 4"):
        check_resume_config(ckpt, running.with_section("model", n_heads=4), step)
    (out / MARKER).unlink()
    more = cfg.model_copy(
        update={
            "train": cfg.train.model_copy(
                update={"max_steps": 4, "resume_from_checkpoint": "latest"}
            )
        }
    )
    assert train_from_config(more, quiet=True).state.step == 4


def test_a_key_a_saved_config_lacks_is_compared_at_the_config_default():
    """A resume reads the checkpoint's config.yaml as plain data: a key it leaves out (one added
    since) stands for the config's default, and the shape fields are the config's."""
    from dataclasses import fields, is_dataclass

    from stackwise.config import Config
    from stackwise.config.sections import RACK_SHAPE_FIELDS as CONFIG_SHAPE
    from stackwise.io.saved_config import DEFAULTS, value
    from stackwise.spec.model import RACK_SHAPE_FIELDS

    assert RACK_SHAPE_FIELDS == CONFIG_SHAPE  # one list, which the config names too
    assert set(RACK_SHAPE_FIELDS) <= set(Config().model.model_fields)
    full = Config().model_dump(mode="json")
    for section, spec in DEFAULTS.items():
        for f in fields(spec):
            if not is_dataclass(getattr(spec, f.name)) and f.name != "greater_is_better":
                assert value({}, section, f.name) == value(full, section, f.name), f.name
