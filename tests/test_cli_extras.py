"""The CLI around training: presets to copy, the end-of-run summary, refusals before any data
work, and library noise kept off stderr."""

from __future__ import annotations

import logging
import warnings

import pytest

from stackwise.cli import PRESETS, main
from stackwise.errors import StackWiseError
from stackwise.io.final import MARKER
from stackwise.pipeline import train_from_config


def test_config_list_and_copy(tmp_path, capsys):
    assert main(["config", "list"]) == 0
    listed = capsys.readouterr().out
    for preset in PRESETS.glob("*.yaml"):
        assert preset.stem in listed
    target = tmp_path / "mine.yaml"
    assert main(["config", "copy", "tiny-clm", str(target)]) == 0
    assert target.read_text() == (PRESETS / "tiny-clm.yaml").read_text()
    target.write_text("edited")
    assert main(["config", "copy", "tiny-clm", str(target)]) == 2  # never overwritten
    assert target.read_text() == "edited" and "exists already" in capsys.readouterr().err
    assert main(["config", "copy", "tiny-clm", str(tmp_path)]) == 0  # into a folder
    assert (tmp_path / "tiny-clm.yaml").read_text() == (PRESETS / "tiny-clm.yaml").read_text()
    assert main(["config", "copy", "no-such", str(tmp_path / "x.yaml")]) == 2
    assert "No preset 'no-such'" in capsys.readouterr().err


def test_refusals_come_before_the_data_is_prepared(tiny, tmp_path, monkeypatch):
    cfg = tiny(train={"max_steps": 2, "save_steps": 2})
    train_from_config(cfg, quiet=True)
    assert (tmp_path / "run" / MARKER).is_file()

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared before the refusal")

    monkeypatch.setattr("stackwise.pipeline.build_data", no_data)
    with pytest.raises(StackWiseError, match="already holds a trained model"):
        train_from_config(cfg, quiet=True)
    other = cfg.model_copy(
        update={
            "train": cfg.train.model_copy(
                update={"output_dir": str(tmp_path / "fresh"), "resume_from_checkpoint": "ckpt-9"}
            )
        }
    )
    (tmp_path / "fresh").mkdir()
    with pytest.raises(StackWiseError, match="ckpt-9' does not exist"):
        train_from_config(other, quiet=True)


def test_the_summary_names_time_metrics_and_next_commands(tiny, tmp_path):
    from stackwise.cli.common import run_summary

    res = train_from_config(tiny(train={"max_steps": 2}), quiet=True)
    text = run_summary(res, 125.4)
    assert text.startswith("--- done in 2m 05s ---")
    assert "final (step 2): val loss" in text
    assert f"stackwise generate --checkpoint {res.output_dir}" in text
    assert f"stackwise eval --checkpoint {res.output_dir}" in text


def test_only_the_known_library_noise_is_filtered(caplog):
    from stackwise.quiet import BNB_KERNELS, BNB_LOGGER, filter_library_noise

    filter_library_noise()
    logger = logging.getLogger(BNB_LOGGER)
    with caplog.at_level(logging.WARNING):
        logger.warning(BNB_KERNELS + ": No module named 'kernels'")
        logger.warning("a real problem in bitsandbytes")
    assert [r.getMessage() for r in caplog.records] == ["a real problem in bitsandbytes"]
    with warnings.catch_warnings(record=True) as caught:
        filter_library_noise()  # catch_warnings reset the filters
        warnings.warn(
            "Detected pickle protocol 4 in the checkpoint, which was not", UserWarning, stacklevel=1
        )
        warnings.warn("a real problem in torch", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a real problem in torch"]


def test_errors_wrap_to_a_terminal_and_stay_one_line_in_pipes_and_logs(monkeypatch):
    """A terminal gets the paragraph wrapped to its width (at most 100 columns) without
    breaking a path; a pipe or a log gets it on one line, whatever COLUMNS or a path's length,
    so `grep` and tests see whole sentences."""
    import io
    import sys

    from stackwise.cli import paragraph

    path = "/tmp/" + "a-very-long-folder-name/" * 4 + "data.jsonl"
    message = f"Instruction data file '{path}' is empty. Give it rows   (--train_file)."

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for columns, widest in (("40", 40), ("200", 100)):
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setattr(sys, "stderr", Terminal())
        lines = paragraph(message).splitlines()
        assert len(lines) > 1 and f"'{path}'" in lines  # the path alone on its line, whole
        assert all(len(line) <= widest for line in lines if line != f"'{path}'")
        monkeypatch.setattr(sys, "stderr", io.StringIO())
        assert paragraph(message) == " ".join(message.split())


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (
            ["--max_steps", "5"],
            "--max_steps: config keys go as key=value here, e.g. train.max_steps=5",
        ),
        (["--lr=0.1"], "--lr: config keys go as key=value here, e.g. train.lr=0.1"),
        # a leaf of several sections: each, with the value
        (
            ["--strategy", "fsdp"],
            "e.g. lora.strategy=fsdp or progressive.strategy=fsdp or parallel.strategy=fsdp",
        ),
        # nearest to a whole section, which takes no value: no `model=X` to copy
        (
            ["--model-size", "big"],
            "--model-size: config keys go as key=value here; `stackwise config show` lists "
            "the model.* keys",
        ),
    ],
)
def test_a_config_key_typed_as_a_flag_is_shown_as_key_value(argv, hint, capsys):
    from stackwise.cli import main

    with pytest.raises(SystemExit) as done:
        main(["train", "tiny-clm", *argv])
    assert done.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert hint in err and "--help" not in err.split("error:")[1]
