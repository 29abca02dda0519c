"""One run per folder: a second process is refused with the holder's PID, a dead holder's lock is
taken over, and the Trainer takes the lock before it trains."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stackwise.errors import StackWiseError
from stackwise.io.lock import LOCK, lock_run_folder, unlock_run_folder

HOLD = """
import sys, time
from pathlib import Path
from stackwise.io.lock import lock_run_folder
lock_run_folder(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def hold_in_other_process(folder):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    other = hold_in_other_process(folder)
    try:
        with pytest.raises(
            StackWiseError, match=rf"in use by another StackWise run \(PID {other.pid}\)"
        ):
            lock_run_folder(folder)
    finally:
        other.kill()
        other.wait()
    time.sleep(0.1)
    note = lock_run_folder(folder)  # the kernel dropped the dead process's flock
    assert note is not None and str(other.pid) in note
    assert lock_run_folder(folder) is None  # re-entrant in this process
    unlock_run_folder(folder)
    assert (folder / LOCK).is_file()


def test_the_trainer_takes_the_lock_before_training(tiny, tmp_path):
    from test_checkpoints import make_trainer

    cfg = tiny(train={"max_steps": 2})
    out = tmp_path / "run"
    out.mkdir()
    other = hold_in_other_process(out)
    try:
        with pytest.raises(StackWiseError, match="in use by another StackWise run"):
            make_trainer(cfg)
        assert not (out / "metrics.jsonl").exists()  # nothing was written by the refused run
    finally:
        other.kill()
        other.wait()


def test_weights_get_the_permissions_of_the_other_files(tmp_path):
    import os

    import torch

    from stackwise.io.files import save_tensors, write_atomic

    save_tensors({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    write_atomic(tmp_path / "config.yaml", "x: 1\n")
    mode = os.stat(tmp_path / "model.safetensors").st_mode & 0o777
    assert mode == os.stat(tmp_path / "config.yaml").st_mode & 0o777


def test_a_run_that_ended_normally_leaves_no_pid_behind(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    code = "import sys; from pathlib import Path; from stackwise.io.lock import lock_run_folder; "
    code += "lock_run_folder(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True)
    assert (folder / LOCK).read_text() == ""
    assert lock_run_folder(folder) is None  # no takeover note: nothing crashed
    unlock_run_folder(folder)


def test_a_finished_run_frees_its_folder_at_once(tiny, tmp_path):
    """A forked or embedded run may never reach interpreter exit: the lock goes with the run."""
    from stackwise.io.lock import LOCK, lock_holder
    from stackwise.pipeline import train_from_config

    res = train_from_config(tiny(train={"max_steps": 2}), quiet=True)
    assert (res.output_dir / LOCK).read_text() == ""  # no PID left to report as "taken over"
    assert lock_holder(res.output_dir) is None
