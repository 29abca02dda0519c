"""Where a run writes: the output-dir policy, decided once by rank 0 and shared."""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from stackwise.errors import StackWiseError
from stackwise.io import checkpoints as ckpt
from stackwise.io.final import MARKER, is_finished
from stackwise.io.lock import LOCK, lock_holder, lock_run_folder, unlock_run_folder
from stackwise.io.stack_files import HISTORY
from stackwise.io.trained import WEIGHTS
from stackwise.spec import Plan


def run_dir_of(config: Plan, output_dir: str | Path | None) -> str | Path | None:
    """The dir a Trainer was given, else the resumed checkpoint's run (when the config names
    one and no train.output_dir), else None: the config decides."""
    tc = config.train
    resume = tc.resume_from_checkpoint
    if output_dir is None and tc.output_dir is None and resume and resume != "latest":
        return Path(resume).expanduser().parent  # continue the checkpoint's run
    return output_dir


def default_run_name(config: Plan) -> str:
    kind = "finetune" if config.model.source == "hf" else config.objective.name
    return f"{kind}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def resolve_output_dir(config: Plan) -> Path:
    """train.output_dir, else outputs/<logging.run_name>, else a time-stamped folder; two
    runs started in the same second (scripts, tests) get -2, -3, ... rather than a refusal."""
    if config.train.output_dir:
        return Path(config.train.output_dir).expanduser()
    if config.logging.run_name:
        return Path("outputs") / config.logging.run_name
    name = default_run_name(config)
    path, n = Path("outputs") / name, 2
    while path.exists():
        path, n = Path("outputs") / f"{name}-{n}", n + 1
    return path


def prepare_output_dir(path: Path, overwrite: bool, resume: str | None = None) -> str | None:
    """Lock the folder for this run, refuse to clobber a finished run, and check that we can
    write, all before any training. Returns a note when a dead run's lock was taken over.

    A run being resumed has checkpoints, stacks and history already (written as it goes);
    only the marker of stackwise.io.final says it finished."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StackWiseError(
            f"Cannot write to output dir '{path}': {err.strerror or err}. Pick a writable "
            "train.output_dir."
        ) from None
    lock = path / LOCK
    before = lock.read_bytes() if lock.is_file() else None
    note = lock_run_folder(path)  # first: a folder in use is refused before anything else
    try:
        _check_and_clear(path, overwrite, resume)
    except StackWiseError:
        unlock_run_folder(path)
        if before is None:  # a refused run leaves the folder exactly as it found it
            lock.unlink(missing_ok=True)
        else:
            lock.write_bytes(before)
        raise
    return note


def is_run_folder(path: Path) -> bool:
    """Whether `path` holds a StackWise run: the lock every run takes first, or (for runs older
    than the lock) the finished marker, a checkpoint pointer, a stack manifest, or weights
    beside config.yaml. A Hugging Face model folder (config.json) is not one."""
    marks = (LOCK, MARKER, ckpt.LATEST, "stacks/manifest.json")
    if any((path / m).exists() for m in marks) or any(path.glob(f"*/{ckpt.LATEST}")):
        return True
    return (path / WEIGHTS).is_file() and (path / "config.yaml").is_file()


CLUTTER = frozenset({".DS_Store", "Thumbs.db", "desktop.ini", ".gitkeep"})  # not a user's work


def _refuse_foreign(path: Path) -> None:
    """A folder holding someone else's files is never written into: a run would replace its
    config.yaml, history.json, README.md, ... without a word. Nothing overrides this."""
    if not path.is_dir() or is_run_folder(path):
        return
    names = sorted(p.name for p in path.iterdir() if p.name not in CLUTTER)
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise StackWiseError(
        f"Output dir '{path}' is not empty ({shown}) and is not a StackWise run, so a run "
        "there could overwrite those files; it is refused, even with "
        "train.overwrite_output_dir=true (which replaces only an earlier StackWise run). Give "
        f"train.output_dir a new or empty folder, such as '{path / 'run'}', or move the files "
        "out of this one first to reuse it."
    )


def _read_paths(config: Plan) -> list[tuple[str, Path]]:
    """(config key, path) of the local files and folders a run reads."""
    m, d = config.model, config.data
    named = [("model.init_from_hf", m.init_from_hf), ("data.dataset_dir", d.dataset_dir)]
    named += [("data.tokenizer", d.tokenizer)]
    if m.source == "hf":
        named.append(("model.model_name_or_path", m.model_name_or_path))
    found = [(k, Path(v).expanduser()) for k, v in named if v and Path(v).expanduser().is_dir()]
    for key, names in (("data.files", d.files), ("data.eval_files", d.eval_files)):
        for name in names:
            path = Path(name).expanduser()
            while any(ch in path.name for ch in "*?["):  # a glob: the folder it searches
                path = path.parent
            found.append((key, path))
    return [(k, p.resolve()) for k, p in found]


def refuse_inputs(path: Path, config: Plan) -> None:
    """The output folder may not be, hold, or lie inside anything the run reads (the base
    model above all: its files would be rewritten), whatever train.overwrite_output_dir says."""
    out = path.expanduser().resolve()
    for key, src in _read_paths(config):
        if out == src or src in out.parents:
            how = "is the same folder as" if out == src else "is inside"
            free = src.with_name(f"{src.name}-run")
        elif out in src.parents:
            how, free = "holds", out.with_name(f"{out.name}-run")
        else:
            continue
        raise StackWiseError(
            f"Output dir '{path}' {how} {key} '{src}', which this run reads; writing there "
            "would change or mix with its files, so it is refused even with "
            "train.overwrite_output_dir=true. Give train.output_dir a folder apart from it, "
            f"such as '{free}'."
        )


# what the CLI and the report add to a finished run: gone with it when it is written over
FINISHED_RUN_EXTRAS = ("eval.json", "eval_samplers.json", "samples.json", "report.html")


def _check_and_clear(path: Path, overwrite: bool, resume: str | None) -> None:
    resuming = resume is not None
    if not overwrite:
        _refuse_taken(path, resume)
    try:
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
        if overwrite:  # the earlier run's checkpoints, curves and finished mark go first
            (path / MARKER).unlink(missing_ok=True)
            if not resuming:
                ckpt.clear_run(path)
                shutil.rmtree(path / "tensorboard", ignore_errors=True)
                for made_after in FINISHED_RUN_EXTRAS:  # they described the earlier run
                    (path / made_after).unlink(missing_ok=True)
    except OSError as err:
        raise StackWiseError(
            f"Cannot write to output dir '{path}': {err.strerror or err}. Pick a writable "
            "train.output_dir."
        ) from None


def _named_checkpoint(resume: str | None, path: Path) -> tuple[Path | None, str]:
    """The checkpoint folder `resume` names in the run at `path`, as a whole path (NEW would
    not hold a bare name), or None for `latest` and none; with a note when it names nothing."""
    if resume in (None, ckpt.LATEST):
        return None, ""
    try:
        return ckpt.resolve_checkpoint(str(resume), path).resolve(), ""
    except StackWiseError:
        return None, f" ({resume} is not a complete checkpoint there)"


def _refuse_taken(path: Path, resume: str | None) -> None:
    """A finished run is never written over; an unfinished one is only resumed. `resume`:
    the checkpoint the run asked for, which the advice keeps (else the folder's last)."""
    marks = (ckpt.LATEST, HISTORY, "stacks/manifest.json")
    progress = [f for f in marks if (path / f).exists()]
    progress += sorted(str(p.relative_to(path)) for p in path.glob(f"*/{ckpt.LATEST}"))
    legacy = (path / WEIGHTS).is_file() and not progress  # finished before the marker existed
    if is_finished(path) or legacy:
        last = ckpt.checkpoints(path)
        named, missing = _named_checkpoint(resume, path)
        start = named or (last[-1].resolve() if last else None)
        more = (
            f" To train on from it, resume {'that' if named else 'its last'} checkpoint"
            f"{missing} into a new folder: train.output_dir=NEW "
            f"train.resume_from_checkpoint={start}."
            if start
            else ""
        )
        raise StackWiseError(
            f"Output dir '{path}' already holds a trained model. Choose another "
            f"train.output_dir, or set train.overwrite_output_dir=true to replace it.{more}"
        )
    if progress and resume is None:
        raise StackWiseError(
            f"Output dir '{path}' holds an unfinished run ({progress[0]} is there, "
            f"{MARKER} is not). Resume it with train.resume_from_checkpoint=latest, choose "
            "another train.output_dir, or set train.overwrite_output_dir=true to start over."
        )


def claim_output_dir(acc: Accelerator, config: Plan, output_dir: str | Path | None) -> Path:
    """Rank 0 picks the (time-stamped) dir and checks it; every rank gets the same path and
    raises the same verdict, so none waits on a dead peer."""
    shared: list[Any] = [str(output_dir) if output_dir else None, None]
    if acc.is_main_process:
        shared[0] = shared[0] or str(resolve_output_dir(config))
        try:
            refuse_inputs(Path(shared[0]), config)
            _refuse_foreign(Path(shared[0]))
            note = prepare_output_dir(
                Path(shared[0]),
                config.train.overwrite_output_dir,
                resume=config.train.resume_from_checkpoint,
            )
            if note:
                print(f"stackwise: {note}", file=sys.stderr)
        except StackWiseError as err:
            shared[1] = str(err)
    if acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(shared, from_process=0)
    if shared[1] is not None:
        raise StackWiseError(shared[1])
    return Path(shared[0])


def precheck_run_dir(config: Plan) -> None:
    """Before data preparation and the model build: a run that would be refused for its
    output folder or its resume path is refused now, in seconds. Reads only; the real claim
    (lock, clearing) is made by claim_output_dir."""
    if os.environ.get("RANK", "0") != "0":
        return  # rank 0 checks; the others would race with its claim of the folder
    tc = config.train
    given = run_dir_of(config, None)
    if given is None and tc.output_dir is None and config.logging.run_name is None:
        return  # a new time-stamped folder
    path = Path(given) if given is not None else resolve_output_dir(config)
    refuse_inputs(path, config)
    _refuse_foreign(path)
    if not path.is_dir():
        if tc.resume_from_checkpoint is not None:  # nothing there to resume: its error says so
            ckpt.resolve_checkpoint(tc.resume_from_checkpoint, path)
        return
    holder = lock_holder(path)
    if holder is not None:
        raise StackWiseError(
            f"Output dir '{path}' is in use by another StackWise run (PID {holder}): wait for "
            "it to end, or choose another train.output_dir."
        )
    if not tc.overwrite_output_dir:
        _refuse_taken(path, tc.resume_from_checkpoint)
    spec = tc.resume_from_checkpoint
    if spec and (spec != ckpt.LATEST or (path / ckpt.LATEST).is_file()):
        ckpt.resolve_checkpoint(spec, path)
    elif spec and not any((path / f).exists() for f in (HISTORY, f"stack_0/{ckpt.LATEST}")):
        ckpt.resolve_checkpoint(spec, path)  # nothing to resume: its error says so
