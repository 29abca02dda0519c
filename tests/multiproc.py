"""Launching `stackwise` from a test as N CPU processes over gloo: ranks forked from a process
that already imported torch (forked_ranks.py), or under torchrun where the launch is the
subject."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import make_corpus, tiny_dict
from forked_ranks import run_forked


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without Accelerate's launch variables, offline, one thread."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))},
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def launch(
    world: int,
    args: list[str],
    cwd: Path,
    timeout: int = 240,
    torchrun: bool = False,
    **env: str,
) -> subprocess.CompletedProcess:
    """`stackwise ARGS` on WORLD ranks, forked (see forked_ranks.py) or, with `torchrun`,
    `python -m torch.distributed.run --nproc_per_node WORLD -m stackwise.cli ARGS`."""
    if not torchrun:
        return run_forked(world, args, cwd, clean_env(**env), timeout)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(world), "-m", "stackwise.cli", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=clean_env(**env), timeout=timeout, cwd=cwd
    )


def tiny_config(root: Path, name: str) -> tuple[Path, Path]:
    """The tiny config for a run in `root/name` (its corpus shared in `root`): (config, out)."""
    corpus = root / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(make_corpus(), encoding="utf-8")
    out = root / name
    config = root / f"{name}.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(corpus, root / "cache", out)))
    return config, out


def tiny_run(
    root: Path,
    name: str,
    world: int,
    overrides: list[str] | None = None,
    torchrun: bool = False,
    **env: str,
) -> tuple[subprocess.CompletedProcess, Path]:
    """A seconds-long `stackwise train` of the tiny config in `root/name`, on `world`
    processes."""
    config, out = tiny_config(root, name)
    proc = launch(world, ["train", str(config), *(overrides or [])], root, torchrun=torchrun, **env)
    return proc, out


def single_run(
    root: Path, name: str, overrides: list[str]
) -> tuple[subprocess.CompletedProcess, Path]:
    """The tiny config as one plain process (no rank variables), forked as the ranks are: the
    reference a sharded run is held to. DDP matches it (test_fsdp.py) and costs two ranks to
    start; the caller passes the global batch (`train.batch_size`) the sharded run's ranks
    add up to."""
    config, out = tiny_config(root, name)
    proc = run_forked(None, ["train", str(config), *overrides], root, clean_env())
    return proc, out


def report(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def train_losses(out: Path) -> dict[int, float]:
    """step -> logged training loss, from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def finished(proc: subprocess.CompletedProcess, out: Path) -> None:
    """A run that ended well: exit 0, no abort at exit, its folder marked complete. gloo's
    threads torn down with the interpreter used to abort an exiting process now and then
    ("terminate called without an active exception"). A rank of several leaves through
    os._exit (stackwise.launcher.leave), forked or not; a forked one-process run skips the
    interpreter's teardown, so the check bites there only under torchrun."""
    assert proc.returncode == 0, report(proc)
    assert "terminate called" not in proc.stderr, report(proc)
    assert (out / "run_complete.json").is_file(), report(proc)
