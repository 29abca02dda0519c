"""kill -9 at random moments, saves included: every resume works and the final weights equal
an uninterrupted run's, bit for bit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import make_corpus, tiny_dict
from safetensors.torch import load_file

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}
MAX_STEPS, KILLS = 60, 7  # kill 3 at a random moment, the others a few steps in


def command(config: Path, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "stackwise.cli", "train", str(config), f"train.output_dir={out}"]
    if (out / "latest").is_file():
        cmd.append("train.resume_from_checkpoint=latest")
    return cmd


def run_to_end(config: Path, out: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        command(config, out), capture_output=True, text=True, env=ENV, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_kill_dash_nine_then_resume_equals_uninterrupted(tmp_path, cache_dir):
    rng = random.Random(1234)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(make_corpus(200), encoding="utf-8")
    data = tiny_dict(corpus, cache_dir, tmp_path / "unused")
    data["model"]["dropout"] = 0.1  # the RNG must be restored too
    data["train"].update(max_steps=MAX_STEPS, save_steps=1, save_total_limit=2, eval_every=5)
    data["logging"].update(console=True, log_every=1)
    data["sample"]["num_samples"] = 0
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))

    reference = tmp_path / "reference"
    run_to_end(config, reference)

    out = tmp_path / "killed"
    kills = resumed = 0
    while kills < KILLS:
        had_checkpoint = (out / "latest").is_file()
        proc = subprocess.Popen(
            command(config, out),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=ENV,
            text=True,
        )
        assert proc.stdout is not None
        if kills % 4 == 3:  # sometimes at any moment: startup, loading, first steps
            time.sleep(rng.uniform(0.2, 2.0))
        else:  # otherwise a few steps in, then a moment later: often inside a save
            target, seen = rng.randint(1, 3), 0
            for line in proc.stdout:
                if line.startswith("resumed from"):
                    resumed += 1
                if line.startswith("step ") and "train/loss" in line:
                    seen += 1
                    if seen >= target:
                        time.sleep(rng.uniform(0.0, 0.03))
                        break
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        # the run must not get to the end between kills (that would leave nothing to resume)
        assert not (out / "model.safetensors").exists(), "raise MAX_STEPS: the run finished"
        assert proc.returncode in (-signal.SIGKILL, 0), proc.returncode
        if had_checkpoint:
            assert (out / "latest").is_file()  # a kill never loses the last checkpoint
    final = run_to_end(config, out)
    assert "resumed from" in final.stdout
    assert resumed >= KILLS // 2  # most restarts really resumed
    want = load_file(str(reference / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    assert want.keys() == got.keys()
    assert all((want[k] == got[k]).all() for k in want)
    assert len(list(out.glob("checkpoint-*"))) <= 2  # rotation held under kills
