"""The final save is staged and marked complete; resume finds checkpoints by name and refuses
a checkpoint of another model."""

from __future__ import annotations

import errno

import pytest
from safetensors import SafetensorError

from stackwise.errors import StackWiseError
from stackwise.io.final import MARKER, STAGING
from stackwise.pipeline import train_from_config


def with_train(cfg, **train):
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.ENOSPC, "No space left on device"), SafetensorError("I/O error: disk full")],
)
def test_a_full_disk_during_the_final_save_keeps_the_run_resumable(
    tiny, tmp_path, monkeypatch, failure
):
    import stackwise.io.files as files

    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    real = files.save_file

    def full_disk(state, path, metadata=None):
        if STAGING in str(path):  # only the final save's files
            raise failure
        return real(state, path, metadata=metadata)

    monkeypatch.setattr(files, "save_file", full_disk)
    with pytest.raises(StackWiseError, match="Saving the final model into") as caught:
        train_from_config(cfg, quiet=True)
    assert "resume_from_checkpoint=latest" in str(caught.value)
    out = tmp_path / "run"
    assert not (out / MARKER).exists() and not (out / STAGING).exists()
    assert not (out / "model.safetensors").exists()  # nothing half-written in place
    assert (out / "latest").read_text().strip() == "checkpoint-4"
    monkeypatch.setattr(files, "save_file", real)
    # the folder is unfinished, not "already holds a trained model": a fresh run is refused
    # with the resume advice, and the resume finishes it from checkpoint-4 without training
    with pytest.raises(StackWiseError, match="unfinished run"):
        train_from_config(cfg, quiet=True)
    done = train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    assert done.state.step == 4 and (out / MARKER).is_file()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer").is_dir()


def test_a_finished_run_is_marked_and_refuses_a_resume(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 2, "save_steps": 2})
    train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    assert (out / MARKER).is_file() and not (out / STAGING).exists()
    with pytest.raises(StackWiseError, match="already holds a trained model") as caught:
        train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)
    assert f"resume_from_checkpoint={out / 'checkpoint-2'}" in str(caught.value)  # how to go on


def test_the_refusal_keeps_the_checkpoint_the_resume_named(tiny, tmp_path, monkeypatch):
    """Resuming a finished run from an earlier checkpoint is refused with advice that resumes
    that checkpoint (as a path: a bare name would be looked for in NEW), not the last one."""
    cfg = tiny(train={"max_steps": 4, "save_steps": 2, "save_total_limit": 3})
    train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    for named in ("checkpoint-2", str(out / "checkpoint-2")):
        with pytest.raises(StackWiseError, match="already holds a trained model") as caught:
            train_from_config(with_train(cfg, resume_from_checkpoint=named), quiet=True)
        said = str(caught.value)
        assert "resume that checkpoint into a new folder: train.output_dir=NEW " in said
        assert f"resume_from_checkpoint={out / 'checkpoint-2'}." in said, said
    with pytest.raises(StackWiseError, match="its last checkpoint") as caught:
        train_from_config(with_train(cfg, resume_from_checkpoint="checkpoint-99"), quiet=True)
    assert "(checkpoint-99 is not a complete checkpoint there)" in str(caught.value)
    assert f"resume_from_checkpoint={out / 'checkpoint-4'}." in str(caught.value)


def test_resume_by_name_looks_in_the_output_dir(tiny, tmp_path, monkeypatch):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    out = tmp_path / "run"
    train_from_config(cfg, quiet=True)
    (out / MARKER).unlink()  # as if the run had stopped after its last checkpoint
    monkeypatch.chdir(tmp_path)  # the current dir holds no checkpoint-2
    resumed = train_from_config(with_train(cfg, resume_from_checkpoint="checkpoint-2"), quiet=True)
    assert resumed.trainer.resumed_from == out / "checkpoint-2"
    assert resumed.state.step == 4 and (out / MARKER).is_file()


def test_resume_names_what_is_missing(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    out = tmp_path / "run"
    train_from_config(with_train(cfg, max_steps=2), quiet=True)
    (out / MARKER).unlink()
    with pytest.raises(StackWiseError, match=r"checkpoint-9.*does not exist.*checkpoint-2"):
        train_from_config(with_train(cfg, resume_from_checkpoint="checkpoint-9"), quiet=True)
    (out / "latest").write_text("checkpoint-7\n")  # the folder it named was deleted
    with pytest.raises(
        StackWiseError, match=r"names 'checkpoint-7'.*no longer exists.*checkpoint-2"
    ):
        train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=True)


def test_resume_refuses_another_shape_and_states_a_new_step_budget(tiny, tmp_path, capsys):
    cfg = tiny(train={"max_steps": 4, "save_steps": 2})
    out = tmp_path / "run"
    train_from_config(with_train(cfg, max_steps=2), quiet=True)
    (out / MARKER).unlink()
    heads = cfg.model_copy(update={"model": cfg.model.model_copy(update={"n_heads": 4})})
    with pytest.raises(StackWiseError, match=r"another model shape.*model.n_heads 2 -> 4"):
        train_from_config(with_train(heads, resume_from_checkpoint="latest"), quiet=True)
    with pytest.raises(StackWiseError, match=r"at step 2, past train\.max_steps=1"):
        shorter = with_train(cfg, max_steps=1, save_steps=1, resume_from_checkpoint="latest")
        train_from_config(shorter, quiet=True)
    res = train_from_config(with_train(cfg, resume_from_checkpoint="latest"), quiet=False)
    assert res.state.step == 4
    said = " ".join(capsys.readouterr().out.split())
    assert "train.max_steps is 4 here but was 2" in said and "LR schedule" in said


def test_a_stage_checkpoint_is_not_taken_for_a_rack(tmp_path):
    from stackwise.runs import load_trained

    stage = tmp_path / "run" / "stack_1" / "checkpoint-2"
    stage.mkdir(parents=True)
    (stage / "trainer_state.json").write_text("{}")
    (stage / "config.yaml").write_text("{}")
    with pytest.raises(StackWiseError, match=r"one progressive stage \(stack_1\).*run folder"):
        load_trained(stage)


def test_an_unfinished_run_folder_points_at_its_latest_checkpoint(tiny, tmp_path):
    from stackwise.runs import load_trained

    cfg = tiny(train={"max_steps": 2, "save_steps": 2})
    train_from_config(cfg, quiet=True)
    out = tmp_path / "run"
    for name in ("config.yaml", MARKER, "model.safetensors"):  # as if it stopped before the end
        (out / name).unlink()
    with pytest.raises(StackWiseError, match=r"has not finished.*checkpoint-2"):
        load_trained(out)
    with pytest.raises(StackWiseError, match="does not exist"):
        load_trained(tmp_path / "nowhere")


def test_overwriting_a_run_drops_its_old_curves(tiny, tmp_path):
    cfg = tiny(train={"max_steps": 2}, logging={"tensorboard": True})
    train_from_config(cfg, quiet=True)
    train_from_config(with_train(cfg, overwrite_output_dir=True), quiet=True)
    assert len(list((tmp_path / "run" / "tensorboard").rglob("events.out.tfevents.*"))) == 1


def test_the_last_checkpoint_holds_the_final_evaluation(tiny, tmp_path):
    """A checkpoint due at the last step is written after that step's evaluation, so its
    history, best metric and best-model record include it (a resume then compares against
    the real best)."""
    import json

    cfg = tiny(train={"max_steps": 4, "save_steps": 2, "eval_every": 2, "save_best_model": True})
    train_from_config(cfg, quiet=True)
    state = json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["last_eval_step"] == 4
    evals = [row for row in state["history"] if "loss" in row]
    assert [row["step"] for row in evals] == [0, 2, 4]
    assert state["best_metric"] == min(row["loss"] for row in evals)
    best_row = min(evals, key=lambda row: row["loss"])
    record = state["extensions"]["best_model"]
    assert (record["best"], record["best_step"]) == (best_row["loss"], best_row["step"])
    assert record["checkpoint"] == f"checkpoint-{best_row['step']}"
