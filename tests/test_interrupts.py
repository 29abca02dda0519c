"""Ctrl-C and SIGTERM keep the work: the step finishes, a checkpoint is written, the error says
how to resume, and the resumed run ends bit for bit where an uninterrupted one does. A second
Ctrl-C aborts at once."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch
import yaml
from conftest import tiny_dict
from safetensors.torch import load_file

from stackwise.errors import StackWiseError
from stackwise.io.final import MARKER
from stackwise.pipeline import train_from_config
from stackwise.train.extensions import REGISTRY, Extension
from stackwise.train.interrupts import StopSignals, TrainingInterrupted


class SignalAt(Extension):
    """Sends this process `signals` (one after another) when a step ends at `step` (of the
    stage growing stack `stack`, in a progressive run)."""

    def __init__(self, step: int, *signals: int, stack: int | None = None) -> None:
        self.step, self.signals, self.stack = step, signals, stack

    def on_step_end(self, run) -> None:
        if run.state.step == self.step and run.stack_index == self.stack:
            for sig in self.signals:
                os.kill(os.getpid(), sig)


@contextlib.contextmanager
def registered(name: str, make) -> Iterator[None]:
    REGISTRY[name] = make
    try:
        yield
    finally:
        del REGISTRY[name]


def grown(tiny, **progressive):
    """Two one-block stacks of diffusion grown one at a time, 4 steps each."""
    return tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        progressive={"strategy": "progressive", **progressive},
        train={"max_steps": 8},
    )


def with_train(cfg, **train):
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_a_checkpoint_and_resume_is_bitwise(tiny, tmp_path, sig):
    base = tiny(model={"dropout": 0.1}, train={"max_steps": 8, "save_steps": 0})
    full = train_from_config(with_train(base, output_dir=str(tmp_path / "full")), quiet=True)
    out = tmp_path / "stopped"
    with registered("signal_at_3", lambda: SignalAt(3, sig)):
        stopping = with_train(base, output_dir=str(out), enabled_extensions=["signal_at_3"])
        with pytest.raises(TrainingInterrupted) as caught:
            train_from_config(stopping, quiet=True)
    err = caught.value
    assert err.step == 3 and err.signal_name == signal.Signals(sig).name
    assert (
        err.checkpoint == out / "checkpoint-3"
        and (out / "latest").read_text().strip() == "checkpoint-3"
    )
    assert not (out / MARKER).exists() and not (out / "model.safetensors").exists()
    command = err.resume_command(["cfg.yaml", f"train.output_dir={out}", "train.max_steps=8"])
    assert command == (
        f"stackwise train cfg.yaml train.max_steps=8 train.output_dir={out} "
        "train.resume_from_checkpoint=latest"
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    resuming = with_train(base, output_dir=str(out), resume_from_checkpoint="latest")
    resumed = train_from_config(resuming, quiet=True)
    assert resumed.trainer.resumed_from.name == "checkpoint-3"
    a, b = full.rack.state_dict(), resumed.rack.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (out / MARKER).is_file()


def test_a_second_ctrl_c_aborts_without_saving(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 8})
    twice = registered("twice", lambda: SignalAt(2, signal.SIGINT, signal.SIGINT))
    with twice, pytest.raises(KeyboardInterrupt):
        train_from_config(with_train(cfg, enabled_extensions=["twice"]), quiet=True)
    out = tmp_path / "run"
    assert not list(out.glob("checkpoint-*")) and not (out / "latest").exists()


def test_sigterm_after_ctrl_c_does_not_abort_the_save():
    """torchrun answers Ctrl-C by sending its workers SIGTERM: that must not abort the save."""
    with StopSignals(announce=False) as signals:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert signals.received == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)


def test_progressive_interrupt_names_the_run_and_resume_finishes(tiny, tmp_path):
    cfg = grown(tiny)
    full = train_from_config(with_train(cfg, output_dir=str(tmp_path / "full")), quiet=True)
    out = tmp_path / "grown-run"
    with registered("stop_in_stack_1", lambda: SignalAt(2, signal.SIGINT, stack=1)):
        stopping = with_train(cfg, output_dir=str(out), enabled_extensions=["stop_in_stack_1"])
        with pytest.raises(TrainingInterrupted) as caught:
            train_from_config(stopping, quiet=True)
    assert caught.value.run_dir == out  # the run folder, not the stage's
    assert caught.value.checkpoint.parent.parent == out
    resuming = with_train(cfg, output_dir=str(out), resume_from_checkpoint="latest")
    resumed = train_from_config(resuming, quiet=True)
    a, b = full.rack.state_dict(), resumed.rack.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (out / MARKER).is_file()


ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


def finishes(argv: list[str]) -> None:
    """Run `stackwise <argv>` (a printed resume command) to its end, successfully."""
    cmd = [sys.executable, "-m", "stackwise.cli", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def test_cli_ctrl_c_prints_a_resume_command_that_finishes(corpus_file, cache_dir, tmp_path):
    data = tiny_dict(corpus_file, cache_dir, tmp_path / "unused")
    data["train"].update(max_steps=100_000, eval_every=1000)
    data["logging"].update(log_every=1, jsonl=True)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "cli-run"
    argv = [str(config), f"train.output_dir={out}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackwise.cli", "train", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.is_file() and metrics.read_text().count("\n") >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    resume = [line for line in stderr.splitlines() if line.strip().startswith("stackwise train")]
    assert len(resume) == 1, stderr
    words = resume[0].split()
    assert words[2:] == [*argv, "train.resume_from_checkpoint=latest"]
    step = int((out / "latest").read_text().split("-")[1])
    finishes(["train", *words[2:], f"train.max_steps={step + 2}"])
    assert (out / MARKER).is_file()
    assert load_file(str(out / "model.safetensors"))


def test_interrupted_joint_tuning_names_the_run_and_a_fresh_start_is_refused(tiny, tmp_path):
    cfg = grown(tiny, mode="fused", joint_tuning_steps=4)
    out = tmp_path / "run"
    with registered("stop_in_joint", lambda: SignalAt(2, signal.SIGINT, stack=None)):
        stopping = with_train(cfg, enabled_extensions=["stop_in_joint"])
        with pytest.raises(TrainingInterrupted) as caught:
            train_from_config(stopping, quiet=True)
    assert caught.value.run_dir == out and caught.value.checkpoint.parent.name == "joint"
    with pytest.raises(StackWiseError, match="unfinished run"):  # its checkpoints are kept
        train_from_config(cfg, quiet=True)
    train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    assert (out / MARKER).is_file()


def test_a_stage_0_interrupt_is_never_cleared_by_a_plain_rerun(tiny, tmp_path):
    cfg = grown(tiny)
    stop = registered("stop_in_stack_0", lambda: SignalAt(2, signal.SIGINT, stack=0))
    with stop, pytest.raises(TrainingInterrupted):
        train_from_config(with_train(cfg, enabled_extensions=["stop_in_stack_0"]), quiet=True)
    saved = tmp_path / "run" / "stack_0" / "checkpoint-2"
    with pytest.raises(StackWiseError, match=r"unfinished run \(stack_0/latest"):
        train_from_config(cfg, quiet=True)
    assert (saved / "model.safetensors").is_file()


def test_a_signal_in_the_last_step_lets_the_run_finish(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 4})
    with registered("stop_at_end", lambda: SignalAt(4, signal.SIGTERM)):
        res = train_from_config(with_train(cfg, enabled_extensions=["stop_at_end"]), quiet=True)
    assert res.state.step == 4 and (tmp_path / "run" / MARKER).is_file()


class SignalOn(Extension):
    """Sends this process `sig` from `hook` while the stage growing stack `stack` runs: a
    signal in a stage's setup (on_train_begin, before its first eval) or as a stage ends."""

    def __init__(self, hook: str, sig: int, stack: int) -> None:
        self.sig, self.stack = sig, stack
        setattr(self, hook, self._send)

    def _send(self, run, *args) -> None:
        if run.stack_index == self.stack:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_as_a_stage_ends_stops_at_the_boundary_and_resume_is_bitwise(tiny, tmp_path, sig):
    cfg = grown(tiny)
    full = train_from_config(with_train(cfg, output_dir=str(tmp_path / "full")), quiet=True)
    out = tmp_path / "run"
    stop = registered("stop_as_0_ends", lambda: SignalOn("on_stack_end", sig, stack=0))
    with stop, pytest.raises(TrainingInterrupted) as caught:
        train_from_config(with_train(cfg, enabled_extensions=["stop_as_0_ends"]), quiet=True)
    err = caught.value
    assert err.where == "after stack 1 of 2" and err.signal_name == signal.Signals(sig).name
    assert err.run_dir == out and err.checkpoint == out / "progressive_history.json"
    assert not (out / "stack_1").exists()  # the next stage never started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    resumed = train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    a, b = full.rack.state_dict(), resumed.rack.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a) and (out / MARKER).is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_stages_setup_saves_after_its_first_step(tiny, tmp_path, sig):
    """The signal lands before stage 2's first eval: that eval and one step run, then the
    stage's checkpoint is written; nothing is lost and the resumed run is the same run."""
    cfg = grown(tiny)
    full = train_from_config(with_train(cfg, output_dir=str(tmp_path / "full")), quiet=True)
    out = tmp_path / "run"
    stop = registered("stop_in_setup", lambda: SignalOn("on_train_begin", sig, stack=1))
    with stop, pytest.raises(TrainingInterrupted) as caught:
        train_from_config(with_train(cfg, enabled_extensions=["stop_in_setup"]), quiet=True)
    assert caught.value.step == 1 and caught.value.checkpoint == out / "stack_1" / "checkpoint-1"
    resumed = train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    a, b = full.rack.state_dict(), resumed.rack.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def wait_for_lines(path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never reached {n} lines (exit {proc.poll()})")


def test_sigterm_as_a_cli_progressive_stage_begins_saves_and_resumes(
    corpus_file, cache_dir, tmp_path
):
    """A real `stackwise train` process gets SIGTERM as stack 2/2 is announced: exit 143, a
    resume command, and that command finishes the run."""
    data = tiny_dict(corpus_file, cache_dir, tmp_path / "unused")
    data["model"].update(n_stacks=2, blocks_per_stack=1)
    data["progressive"] = {"strategy": "progressive", "steps_per_stack": 6}
    del data["train"]["max_steps"]  # the stacks' budgets set it
    data["logging"].update(console=True)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    out = tmp_path / "cli-run"
    argv = [str(config), f"train.output_dir={out}"]
    cmd = [sys.executable, "-m", "stackwise.cli", "train", *argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("stack 2/2"):
            proc.send_signal(signal.SIGTERM)
            break
    _, stderr = proc.communicate(timeout=180)
    said = " ".join(stderr.split())
    assert proc.returncode == 143 and "stopped by SIGTERM" in said, stderr
    assert "Traceback" not in stderr
    resume = [shlex.split(line) for line in stderr.splitlines() if "resume_from_checkpoint" in line]
    assert resume and resume[0][:2] == ["stackwise", "train"]
    finishes([*resume[0][1:]])
    assert (out / MARKER).is_file() and (out / "stacks" / "stack_1.safetensors").is_file()


def test_finetune_ctrl_c_exits_130_with_a_runnable_resume_command(tmp_path):
    from hf_fixtures import chat_file, tiny_hf

    model, chat = tiny_hf(tmp_path / "base"), chat_file(tmp_path / "chat.jsonl", n=24)
    out = tmp_path / "ft"
    flags = ["--model_name_or_path", str(model), "--train_file", str(chat), "--use_lora", "True"]
    flags += ["--max_steps", "100000", "--train_batch_size", "2", "--output_dir", str(out)]
    flags += ["logging.jsonl=true", "logging.log_every=1", "train.eval_every=100000"]
    cmd = [sys.executable, "-m", "stackwise.cli", "finetune", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for_lines(out / "metrics.jsonl", 2, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 130, stderr
    assert "error:" not in stderr and "Traceback" not in stderr
    (resume,) = [
        shlex.split(line) for line in stderr.splitlines() if "--resume_from_checkpoint" in line
    ]
    assert resume[:2] == ["stackwise", "finetune"] and resume[-4:] == [
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        "latest",
    ]
    step = int((out / "latest").read_text().split("-")[1])
    resume[resume.index("--max_steps") + 1] = str(step + 1)
    finishes([*resume[1:]])
    assert (out / MARKER).is_file()


def test_sigterm_before_training_cleans_up_and_exits_143(monkeypatch, capsys):
    """Before training there is nothing to save: SIGTERM unwinds like Ctrl-C (finally blocks
    run) instead of killing the process mid-write."""
    from stackwise import cli

    cleaned: list[bool] = []

    def preparing(ns) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
            return 0
        finally:
            cleaned.append(True)

    monkeypatch.setattr("stackwise.cli.parsers.cmd_env", preparing)  # `env` stands in
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["env"]) == 143
    assert cleaned == [True] and "interrupted by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_from_a_launcher_points_at_the_failed_peer(monkeypatch, capsys):
    """Under torchrun a process stopped by SIGTERM was stopped because a peer failed: the
    line says to read that error, not that this process was interrupted for no reason."""
    from stackwise import cli

    def stopped(ns) -> int:
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr("stackwise.cli.parsers.cmd_env", stopped)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["env"]) == 143
    assert "one fails: see its error above" in capsys.readouterr().err
