"""What a run or a merge writes never lands on someone else's files or on its own inputs, and a
write that fails (full disk, read-only place) is one paragraph that leaves nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hf_fixtures import chat_file, hf_config, tiny_hf

from stackwise.cli import main
from stackwise.errors import StackWiseError
from stackwise.io.files import new_folder
from stackwise.pipeline import train_from_config


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr as one line (the CLI wraps its paragraph to the terminal)."""
    return " ".join(capsys.readouterr().err.split())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def no_leftovers(parent: Path, name: str) -> bool:
    """Neither the output nor a temporary folder of it."""
    return not any(p.name.startswith((name, f".{name}")) for p in parent.iterdir())


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("safety")
    (root / "data").mkdir()
    return {"model": tiny_hf(root / "base"), "chat": chat_file(root / "data" / "c.jsonl")}


@pytest.fixture(scope="module")
def finetuned(hf: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ft") / "run"
    train_from_config(hf_config(hf["model"], hf["chat"], out), quiet=True)
    return out


def finetune_flags(hf: dict[str, Path], out: Path) -> list[str]:
    return [
        "finetune", "--model_name_or_path", str(hf["model"]), "--train_file", str(hf["chat"]),
        "--output_dir", str(out), "--max_steps", "1", "--max_seq_length", "96",
    ]  # fmt: skip


# -- a run's output folder -------------------------------------------------------------------


def test_train_never_writes_into_a_folder_that_is_not_a_run(tiny, tmp_path, capsys):
    mine = tmp_path / "run"  # where tiny() trains
    mine.mkdir()
    for name in ("README.md", "config.yaml", "history.json", "metrics.jsonl"):
        (mine / name).write_text(f"the user's {name}\n")
    before = snapshot(mine)
    for overwrite in (False, True):
        cfg = tiny(train={"overwrite_output_dir": overwrite})
        with pytest.raises(StackWiseError, match="is not a StackWise run") as err:
            train_from_config(cfg, quiet=True)
        assert f"'{mine / 'run'}'" in str(err.value)  # the way out: a fresh subfolder
        assert snapshot(mine) == before and sorted(os.listdir(mine)) == sorted(before)
    file = tmp_path / "c.yaml"
    file.write_text(tiny().to_yaml())
    assert main(["train", str(file)]) == 2
    err = said(capsys)
    assert "(README.md, config.yaml, history.json and 1 more)" in err and "Traceback" not in err
    assert snapshot(mine) == before
    for name in before:  # the files moved out: the folder is reused
        (mine / name).unlink()
    (mine / ".DS_Store").write_bytes(b"")  # a file manager's leftovers are not the user's work
    res = train_from_config(tiny(), quiet=True)
    assert res.output_dir == mine and (mine / "run_complete.json").is_file()


def test_finetune_refuses_a_folder_of_other_files(hf, tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "README.md").write_text("keep me")
    assert main(finetune_flags(hf, out)) == 2
    err = said(capsys)
    assert "is not a StackWise run" in err and "--output_dir (train.output_dir)" in err
    assert os.listdir(out) == ["README.md"] and (out / "README.md").read_text() == "keep me"


def test_finetune_never_writes_into_its_inputs(hf, tmp_path, capsys):
    base, data = hf["model"], hf["chat"].parent
    before = snapshot(base)
    cases = [
        (base, "is the same folder as --model_name_or_path"),
        (base / "ft", "is inside --model_name_or_path"),
        (base.parent, "holds --model_name_or_path"),
        (data, "holds --train_file (data.files)"),
    ]
    for out, words in cases:
        for extra in ([], ["train.overwrite_output_dir=true"]):
            assert main([*finetune_flags(hf, out), *extra]) == 2
            err = said(capsys)
            assert words in err and "even with train.overwrite_output_dir=true" in err, out
            assert "Traceback" not in err
    assert snapshot(base) == before and not (base / "ft").exists()
    assert os.listdir(data) == [hf["chat"].name]


def test_finetune_on_a_truncated_base_is_one_paragraph(tmp_path, capsys):
    base = tiny_hf(tmp_path / "base")
    weights = base / "model.safetensors"
    with weights.open("r+b") as fh:  # an interrupted download
        fh.truncate(weights.stat().st_size // 2)
    chat = chat_file(tmp_path / "c.jsonl")
    out = tmp_path / "out"
    assert main(finetune_flags({"model": base, "chat": chat}, out)) == 2
    err = said(capsys)
    assert f"The weights in model folder '{base}' cannot be read" in err
    assert "Download or copy the model again" in err and "Traceback" not in err
    assert not out.exists()


# -- eval --reference ------------------------------------------------------------------------


def test_eval_refuses_a_masked_reference_before_any_scoring(tiny, monkeypatch, capsys):
    res = train_from_config(tiny(objective={"name": "diffusion"}), quiet=True)
    import stackwise.evaluate as ev

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("scored before the reference was checked")

    monkeypatch.setattr(ev, "likelihood", no_work)
    monkeypatch.setattr("stackwise.data.pack.build_data", no_work)
    run = str(res.output_dir)
    assert main(["eval", "--checkpoint", run, "--reference", run]) == 2
    err = said(capsys)
    assert f"--reference '{run}' is a diffusion run" in err and "objective clm" in err
    assert "Traceback" not in err and not (res.output_dir / "eval.json").exists()
    missing = str(res.output_dir.parent / "no-such-run")
    assert main(["eval", "--checkpoint", run, "--reference", missing]) == 2
    assert f"--reference: '{missing}' does not exist" in said(capsys)  # which path is wrong


# -- writes that fail ------------------------------------------------------------------------


def full_disk(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def make_read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """chmod the folder read-only; as root (whom chmod does not stop) its mkdir is refused
    as the kernel would refuse it, so the test checks the same behaviour everywhere."""
    folder.chmod(0o555)
    if os.geteuid() != 0:
        return
    real = Path.mkdir

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self.parent == folder:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", mkdir)


def test_hf_merge_on_a_full_disk_or_a_read_only_place(finetuned, tmp_path, monkeypatch, capsys):
    out = tmp_path / "merged"
    with monkeypatch.context() as m:  # the disk fills at the last file
        m.setattr("transformers.GenerationConfig.save_pretrained", full_disk)
        assert main(["merge-lora", str(finetuned), str(out)]) == 2
    err = said(capsys)
    assert f"Could not write the merged model to '{out}': the disk is full (ENOSPC" in err
    assert "Free some space" in err and "Traceback" not in err
    assert no_leftovers(tmp_path, "merged")
    locked = tmp_path / "locked"
    locked.mkdir()
    with monkeypatch.context() as m:
        make_read_only(locked, m)
        assert main(["merge-lora", str(finetuned), str(locked / "m")]) == 2
    locked.chmod(0o755)
    err = said(capsys)
    assert "permission denied (EACCES)" in err and "Pick a folder you can write to" in err
    assert os.listdir(locked) == []
    assert main(["merge-lora", str(finetuned), str(out)]) == 0  # the retry is not refused
    assert (out / "model.safetensors").is_file() and no_leftovers(tmp_path, ".merged")


def test_rack_merge_and_export_on_a_full_disk(tiny, tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    cfg = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        progressive={"strategy": "progressive", "steps_per_stack": 2, "trunk_strategy": "qlora"},
        lora={"enabled": True, "trunk_adapters": True},
        quant={"enabled": True, "type": "fp32"},
        train={"max_steps": 600},  # the default: each stack's steps_per_stack decides
    )
    run = train_from_config(cfg, quiet=True).output_dir
    merged, export = tmp_path / "merged", tmp_path / "export"
    real_error = SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    )

    def safetensors_full(*args: object, **kwargs: object) -> None:
        raise real_error  # what safetensors raises on a full disk

    with monkeypatch.context() as m:
        m.setattr("stackwise.io.files.save_file", safetensors_full)
        assert main(["merge-lora", str(run), str(merged)]) == 2
        err = said(capsys)
        assert f"Could not write the merged rack to '{merged}': the disk is full" in err
        assert "Traceback" not in err and no_leftovers(tmp_path, "merged")
    assert main(["merge-lora", str(run), str(merged)]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr("stackwise.io.files.save_file", full_disk)
        assert main(["export-hf", str(merged), str(export)]) == 2
    err = said(capsys)
    assert f"Could not write the export to '{export}': the disk is full (ENOSPC" in err
    assert no_leftovers(tmp_path, "export")
    assert main(["export-hf", str(merged), str(export)]) == 0


def test_a_staged_folder_is_removed_on_any_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="a bug"), new_folder(out, "{reason}", "w") as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("a bug")  # not a write failure: raised as it is
    assert os.listdir(tmp_path) == []
    for code, words in ((errno.EROFS, r"read-only \(EROFS\)"), (errno.EACCES, "EACCES")):
        with pytest.raises(StackWiseError, match=words), new_folder(out, "{reason}", "w") as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise OSError(code, os.strerror(code))
        assert os.listdir(tmp_path) == []
    out.mkdir()  # an empty OUT is replaced whole
    with new_folder(out, "{reason}", "w") as tmp:
        (tmp / "done.txt").write_text("ok")
    assert os.listdir(tmp_path) == ["out"] and (out / "done.txt").read_text() == "ok"


def test_runs_started_in_the_same_second_get_their_own_folders(tiny, tmp_path, monkeypatch):
    """The default folder is time-stamped to the second: a second run in that second used to
    be refused as 'already holds a trained model'."""
    from stackwise.train import run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_dir, "default_run_name", lambda config: "clm-20261125-151904")
    cfg = tiny(train={"output_dir": None})
    first = train_from_config(cfg, quiet=True).output_dir
    second = train_from_config(cfg, quiet=True).output_dir
    assert (first.name, second.name) == ("clm-20261125-151904", "clm-20261125-151904-2")
    assert (second / "run_complete.json").is_file()
