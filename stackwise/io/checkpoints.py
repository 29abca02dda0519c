"""Training checkpoints you can trust: atomic, rotated, resumable bit for bit.

Layout of `outputs/<run>/checkpoint-<step>/`:
  model.safetensors     the model's weights
  optimizer.bin         optimizer state_dict (tensors and plain containers only)
  scheduler.bin         LR scheduler state_dict
  trainer_state.json    step, epoch, sampler position, tokens, history, extension states
  rng_state_<rank>.json python, numpy and torch (CPU and CUDA) generator states of each rank
  config.yaml           the run's config
A checkpoint is written into `.checkpoint-<step>.tmp`, every file fsynced, then renamed into
place; `latest` (a one-line file naming the newest checkpoint) is replaced last. A crash at any
moment leaves the previous checkpoint and pointer intact. The .bin files are read back with
`torch.load(weights_only=True)`, which refuses anything but tensors and plain containers.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Callable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stackwise.config import Config, load_config
from stackwise.config.sections import RACK_SHAPE_FIELDS
from stackwise.errors import StackWiseError
from stackwise.io.files import read_json, read_tensors, read_torch

LATEST = "latest"
STATE = "trainer_state.json"
PATTERN = re.compile(r"^checkpoint-(\d+)$")
RESUME_ELSEWHERE = "Resume from another checkpoint."


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


# fields that make the saved weights a different function: a resume that changes one is refused
SHAPE_FIELDS = RACK_SHAPE_FIELDS


def differences(
    section: str,
    saved: Config,
    config: Config,
    fields: Sequence[str],
    value: Callable[[Config, str], object] | None = None,
) -> list[str]:
    """`section.field saved -> now` for each field that differs between the configs, compared
    by `value(config, field)` (default: the field's own value)."""

    def plain(c: Config, f: str) -> object:
        return getattr(attrgetter(section)(c), f)

    key = value or plain
    return [
        f"{section}.{f} {plain(saved, f)} -> {plain(config, f)}"
        for f in fields
        if key(saved, f) != key(config, f)
    ]


def _memory_value(config: Config, name: str) -> object:
    """memory.<name>; a rack's layers as the blocks they name ([-1] is [3] of 4 blocks). A
    Hugging Face model's layer count is unknown here: its memory.safetensors, keyed by the
    layers' indices, refuses other layers when it loads."""
    value = getattr(config.memory, name)
    if name == "layers":
        if config.model.source != "rack":
            return None
        return sorted(i % config.model.n_layers for i in value)
    return value


def check_resume_config(path: Path, config: Config, step: int = 0) -> str | None:
    """Refuse a checkpoint whose model differs from this run's, or that is already past the
    step budget; return a note when the budget differs (the LR schedule follows the new one)."""
    check_step_budget(path, step, config.train.max_steps)
    saved_path = path / "config.yaml"
    if not saved_path.is_file():
        return None
    saved = load_config(saved_path)
    changed = differences("model", saved, config, SHAPE_FIELDS)
    # what the experts are and how they route
    moe = ("num_experts", "top_k", "expert_hidden", "shared_expert", "stacks")
    changed += differences("model.moe", saved, config, moe)
    if saved.memory_on != config.memory_on:
        on = {True: "on", False: "off"}
        changed.append(f"memory layers {on[saved.memory_on]} -> {on[config.memory_on]}")
    elif config.memory_on:
        memory = ("chapters", "slots_per_chapter", "top_k", "layers")
        changed += differences("memory", saved, config, memory, _memory_value)
    if saved.objective.name != config.objective.name:
        changed.append(f"objective.name {saved.objective.name} -> {config.objective.name}")
    check_stream(path, saved, config)
    if changed:
        raise StackWiseError(
            f"The checkpoint '{path}' was trained with another model shape than this config "
            f"asks for ({'; '.join(changed)}). Resume with the config it was saved with (its "
            "config.yaml), or start a new run in another train.output_dir."
        )
    before, now = saved.train.max_steps, config.train.max_steps
    if before == now:
        return None
    return (
        f"note: train.max_steps is {now} here but was {before} when '{path.name}' was saved: "
        f"the LR schedule now runs to step {now}, so this run will not match one that was "
        "never interrupted."
    )


# what a stream position counts in: another value makes the saved position point elsewhere
STREAM_FIELDS = (
    "streaming",
    "files",
    "dataset_dir",
    "dataset_name",
    "dataset_subset",
    "dataset_split",
    "format",
    "text_field",
    "tokenizer",
    "seq_len",
    "stream_val_blocks",
    "num_samples",
)


def check_stream(path: Path, saved: Config, config: Config) -> None:
    """A streamed run resumes only over the data it was reading: its position counts pieces,
    tokens and blocks of that data (a token store notices an edit itself; a stream cannot)."""
    if not (saved.data.streaming or config.data.streaming):
        return
    changed = differences("data", saved, config, STREAM_FIELDS)
    if changed:
        raise StackWiseError(
            f"The checkpoint '{path}' was reading its data as another stream "
            f"({'; '.join(changed)}), so its saved position would point elsewhere in this one. "
            "Resume with the data settings it was saved with (its config.yaml), or start a new "
            "run in another train.output_dir."
        )


def check_step_budget(path: Path, step: int, max_steps: int) -> None:
    """A checkpoint already past the run's budget would train nothing and save as if done."""
    if step > max_steps:
        raise StackWiseError(
            f"The checkpoint '{path}' is at step {step}, past train.max_steps={max_steps}: "
            "nothing would be trained. Raise train.max_steps above "
            f"{step}, or resume from an earlier checkpoint."
        )
