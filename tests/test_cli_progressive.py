"""`stackwise train` with no config grows the default 4-stack diffusion preset (shortened here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_cli import ENV, explain

from stackwise.cli import resolve_config_path
from stackwise.config import load_config

SHORT = [
    "data.num_samples=64",
    "train.batch_size=8",
    "train.eval_batches=1",
    "logging.progress_bar=always",
    "sample.max_new_tokens=8",
    "sample.steps=4",
]
# the default splits train.max_steps by budget shares (stack k weighs k + 1); the cached
# preset gives each stack its own steps
BUDGET = {
    None: (["train.max_steps=20"], [2, 4, 6, 8]),
    "tiny-diffusion-progressive-cached": (
        ["progressive.steps_per_stack=4", "progressive.stacks.0.steps=4"],
        [4, 4, 4, 4],
    ),
}


@pytest.mark.parametrize("preset", [None, "tiny-diffusion-progressive-cached"])
def test_default_train_grows_four_stacks_with_curves_saved_stacks_and_samples(tmp_path, preset):
    config = load_config(resolve_config_path(preset))  # None: the default preset
    assert config.progressive.strategy == "progressive" and config.model.n_stacks == 4
    assert config.objective.name == "diffusion" and config.data.tokenizer == "char"
    cached = config.progressive.cache.enabled
    assert cached == (preset is not None)
    budget, steps = BUDGET[preset]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stackwise.cli",
            "train",
            *([preset] if preset else []),
            *SHORT,
            *budget,
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    # the header says how the stages see t, as the preset's rack reads it (or does not)
    reads_t = config.model.time_conditioning != "none"
    expected = ", time as input (" if reads_t else ", every stage on every noise level, no time"
    assert expected in proc.stdout, explain(proc)
    (run,) = (tmp_path / "outputs").iterdir()
    for k in range(4):
        assert (run / "stacks" / f"stack_{k}.safetensors").is_file()
        assert any((run / f"stack_{k}" / "tensorboard").iterdir())  # one TB curve per stack
        assert f"stack {k + 1}/4" in proc.stderr  # a progress bar per stack
    table = proc.stdout[proc.stdout.index("stack pos") :]
    assert len([ln for ln in table.splitlines() if ln.strip()[:1].isdigit()]) == 4
    assert "final rack (full noise range)" in proc.stdout and "bits per character" in proc.stdout
    assert "val bpc" in table
    assert proc.stdout.count("--- sample") == config.sample.num_samples
    hist = json.loads((run / "progressive_history.json").read_text())
    assert [s["steps"] for s in hist["stacks"]] == steps
    assert all("bpc" in s["eval"] for s in hist["stacks"])
    if cached:
        assert hist["stacks"][3]["cache"]["hits"] > 0  # later stacks read the cached trunk

    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "stackwise.cli",
            "generate",
            "--checkpoint",
            str(run),
            "--prompt",
            "The king",
            "--max-new-tokens",
            "8",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        check=False,
    )
    assert gen.returncode == 0 and gen.stdout.strip(), explain(gen)
