"""Training checkpoints you can trust: atomic, rotated, resumable bit for bit.

Layout of `outputs/<run>/checkpoint-<step>/`:
  model.safetensors     the model's weights (an HF model: its adapter's files), read on resume
  model.pt              the whole model's state dict in train.save_precision, for inference:
                        plain tensors, torch.load(weights_only=True) reads it
  optimizer.bin         optimizer state_dict (tensors and plain containers only)
  scheduler.bin         LR scheduler state_dict
  trainer_state.json    step, epoch, sampler position, tokens, history, extension states
  rng_state_<rank>.json python, numpy and torch (CPU and CUDA) generator states of each rank
  config.yaml           the run's config
A checkpoint is written into `.checkpoint-<step>.tmp`, every file fsynced, then renamed into
place; `latest` (a one-line file naming the newest checkpoint) is replaced last. A crash at any
moment leaves the previous checkpoint and pointer intact. The .bin files (and model.pt) are read
back with `torch.load(weights_only=True)`, which refuses anything but tensors and plain
containers.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stackwise.errors import StackWiseError
from stackwise.io.files import read_json, read_tensors, read_torch
from stackwise.io.run_folder import LATEST, STATE
from stackwise.io.saved_config import (
    RESUME_ELSEWHERE,
    check_stream,
    plain_config,
    read_saved,
    shape_changes,
    value,
)

CONSOLIDATED = "model.pt"
PATTERN = re.compile(r"^checkpoint-(\d+)$")


# -- RNG ----------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *[float(x) for x in np_state[2:]]],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# -- finding checkpoints --------------------------------------------------------------------


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (temporary dirs excluded), oldest step first."""
    found = []
    for p in run_dir.iterdir() if run_dir.is_dir() else []:
        m = PATTERN.match(p.name)
        if m and p.is_dir() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def resolve_checkpoint(spec: str, run_dir: Path) -> Path:
    """`latest` (the run dir's pointer), a checkpoint-<step> name inside the run dir, or a path
    to a checkpoint dir."""
    if spec == LATEST:
        pointer = run_dir / LATEST
        if not pointer.is_file():
            raise StackWiseError(
                f"train.resume_from_checkpoint is 'latest', but '{run_dir}' has no '{LATEST}' "
                "pointer (no checkpoint was ever completed there). Check train.output_dir, pass "
                "a checkpoint-<step> folder, or start without resuming."
            )
        path = run_dir / pointer.read_text(encoding="utf-8").strip()
        if not path.is_dir():
            raise StackWiseError(
                f"'{pointer}' names '{path.name}', but '{path}' no longer exists. "
                f"{_available(run_dir)}"
            )
    else:
        given = Path(spec).expanduser()
        inside = run_dir / given
        path = inside if not given.is_absolute() and inside.is_dir() else given
        if not path.exists():
            places = f"'{given}'" if given.is_absolute() else f"'{inside}' or '{given.resolve()}'"
            raise StackWiseError(
                f"train.resume_from_checkpoint='{spec}' does not exist: looked for {places}. "
                f"{_available(run_dir)}"
            )
    if path.is_file():
        raise StackWiseError(
            f"train.resume_from_checkpoint '{path}' is a file, but a checkpoint is a "
            f"checkpoint-<step> folder of a run. Pass such a folder, or 'latest'."
        )
    if not (path / STATE).is_file():
        raise StackWiseError(
            f"'{path}' is not a complete checkpoint (no {STATE}). Pass a checkpoint-<step> "
            "folder written by save_steps, or 'latest'."
        )
    return path


def _available(run_dir: Path) -> str:
    names = [p.name for p in checkpoints(run_dir)]
    if not names:
        return f"'{run_dir}' holds no complete checkpoint: start without resuming."
    return f"The complete checkpoints in '{run_dir}' are: {', '.join(names)}."


def clean_partial(run_dir: Path) -> None:
    """Remove what an interrupted save or deletion left behind."""
    for pattern in (".checkpoint-*.tmp", ".checkpoint-*.deleting"):
        for p in run_dir.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def remove_checkpoint(path: Path) -> None:
    """Rename first, then delete: a kill mid-way never leaves a half-deleted folder that still
    looks like a complete checkpoint."""
    doomed = path.with_name(f".{path.name}.deleting")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clear_run(run_dir: Path) -> None:
    """overwrite_output_dir: drop an earlier run's checkpoints and pointer."""
    (run_dir / LATEST).unlink(missing_ok=True)
    for p in checkpoints(run_dir):
        remove_checkpoint(p)
    clean_partial(run_dir)


def rotate(run_dir: Path, limit: int | None, keep: set[str]) -> list[Path]:
    """Delete the oldest checkpoints beyond `limit`, never one named in `keep` (the best)."""
    if limit is None:
        return []
    all_ckpts = checkpoints(run_dir)
    latest = (run_dir / LATEST).read_text().strip() if (run_dir / LATEST).is_file() else None
    protected = keep | ({latest} if latest else set())
    removable = [p for p in all_ckpts if p.name not in protected]
    excess = len(all_ckpts) - limit
    gone = []
    for p in removable:
        if excess <= 0:
            break
        remove_checkpoint(p)
        gone.append(p)
        excess -= 1
    return gone


# -- reading back -------------------------------------------------------------------------


def load_bin(path: Path) -> Any:
    return read_torch(path, RESUME_ELSEWHERE)


def load_json(path: Path) -> Any:
    return read_json(path, RESUME_ELSEWHERE)


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    return read_tensors(path, RESUME_ELSEWHERE)


def check_resume_config(path: Path, config: Any, step: int = 0) -> str | None:
    """Refuse a checkpoint whose model differs from this run's (`config`: its Plan, or a
    config), or that is already past the step budget; return a note when the budget differs
    (the LR schedule follows the new one). Compared as plain data: the checkpoint's
    config.yaml (a key it lacks has its default) against the running config's; the step
    budget is the running one's own (a Plan's, resolved from epochs)."""
    now = plain_config(config)
    steps = value(now, "train", "max_steps") if isinstance(config, dict) else config.train.max_steps
    check_step_budget(path, step, steps)
    saved = read_saved(path)
    if saved is None:
        return None
    changed = shape_changes(saved, now)
    check_stream(path, saved, now)
    if changed:
        raise StackWiseError(
            f"The checkpoint '{path}' was trained with another model shape than this config "
            f"asks for ({'; '.join(changed)}). Resume with the config it was saved with (its "
            "config.yaml), or start a new run in another train.output_dir."
        )
    before = value(saved, "train", "max_steps")
    if before == steps:
        return None
    return (
        f"note: train.max_steps is {steps} here but was {before} when '{path.name}' was saved: "
        f"the LR schedule now runs to step {steps}, so this run will not match one that was "
        "never interrupted."
    )


def check_step_budget(path: Path, step: int, max_steps: int) -> None:
    """A checkpoint already past the run's budget would train nothing and save as if done."""
    if step > max_steps:
        raise StackWiseError(
            f"The checkpoint '{path}' is at step {step}, past train.max_steps={max_steps}: "
            "nothing would be trained. Raise train.max_steps above "
            f"{step}, or resume from an earlier checkpoint."
        )
