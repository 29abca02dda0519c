"""A long TMPDIR (CI runners, nested sandboxes) must not hang loader workers: they hand tensors
over AF_UNIX sockets made under it, whose paths hold at most 107 bytes."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml
from conftest import tiny_dict


def test_loader_workers_train_under_a_tmpdir_too_long_for_a_socket(
    tmp_path, corpus_file, cache_dir
):
    long_tmp = tmp_path / ("a-temporary-folder-with-a-long-name-" * 4)
    long_tmp.mkdir()
    assert len(str(long_tmp)) > 107
    data = tiny_dict(corpus_file, cache_dir, tmp_path / "run")
    data["data"]["num_workers"] = 1
    config = tmp_path / "workers.yaml"
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "TMPDIR": str(long_tmp), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "stackwise", "train", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "AF_UNIX path too long" not in done.stderr
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_the_short_ipc_dir_is_only_taken_when_the_temp_dir_is_too_long(monkeypatch, tmp_path):
    import multiprocessing.process
    import tempfile

    from stackwise.train.sampler import IPC_TEMPDIR_MAX, ipc_tempdir_that_fits

    config = multiprocessing.process.current_process()._config
    monkeypatch.setitem(config, "tempdir", None)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert ipc_tempdir_that_fits() is None and config["tempdir"] is None
    monkeypatch.setattr(tempfile, "tempdir", "/x" * IPC_TEMPDIR_MAX)
    folder = ipc_tempdir_that_fits()
    assert folder is not None and config["tempdir"] == folder and os.path.isdir(folder)
    assert len(folder) <= IPC_TEMPDIR_MAX
    os.rmdir(folder)
