"""The `stackwise` command line, run as a subprocess the way a user runs it.

Each CLI process spends seconds importing torch, so the runs are launched in two batches, two at
a time (there are two cores), from module fixtures; the tests then check one run each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_corpus, tiny_dict
from hypothesis import given
from hypothesis import strategies as st

from stackwise.config import from_dict, load_config

ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",  # tiny models; one thread each keeps concurrent runs from stalling
}
PROMPT = "The king"
LONG_DIR = "a-rather-long-folder-name-with-many-hyphens/another-hyphenated-sub-folder-name-here"

Proc = subprocess.CompletedProcess


def cli(*args: Any, timeout: float = 240) -> Proc:
    return subprocess.run(
        [sys.executable, "-m", "stackwise.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        check=False,
    )


def run_all(jobs: dict[str, list[Any]]) -> dict[str, Proc]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(cli, *args) for name, args in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def explain(proc: Proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@dataclass
class Work:
    root: Path
    config: Path
    runs: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    # case -> (needles in the message, check run afterwards)
    errors: dict[str, tuple[tuple[str, ...], Callable[[], None] | None]] = field(
        default_factory=dict
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Work:
    """Phase 1: three trainings plus every case that needs no trained model."""
    root = tmp_path_factory.mktemp("cli")
    corpus = root / "corpus.txt"
    corpus.write_text(make_corpus(), encoding="utf-8")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(corpus, root / "cache", root / "unused")))
    w = Work(root, config)
    jobs: dict[str, list[Any]] = {}
    for name, extra in {
        "clm": [
            "train.max_steps=60",
            "train.eval_every=20",
            "logging.tensorboard=true",
            "logging.console=true",
            "logging.progress_bar=auto",
            "sample.num_samples=2",
            "train.save_steps=30",
        ],
        "diffusion": ["objective.name=diffusion", "train.max_steps=6"],
        "mlm": ["objective.name=mlm", "train.max_steps=6"],
    }.items():
        w.runs[name] = root / f"run-{name}"
        jobs[f"train-{name}"] = ["train", config, f"train.output_dir={w.runs[name]}", *extra]

    jobs["show"] = ["config", "show", config, "train.max_steps=7"]
    jobs["validate"] = ["config", "validate", config]

    def error(name: str, args: list[Any], *needles: str) -> None:
        jobs[name] = args
        w.errors[name] = (needles, None)

    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("model:\n  d_model: 32\n  n_heads: [2\ntrain: {}\n", encoding="utf-8")
    error("malformed-yaml", ["train", bad_yaml], str(bad_yaml), "not valid YAML")
    error(
        "unknown-key",
        ["train", config, "train.max_step=5"],
        "train.max_step",
        "did you mean 'max_steps'",
    )
    error("wrong-type", ["train", config, "train.lr=fast"], "train.lr", "'fast'")
    error("zero-size", ["train", config, "model.d_model=0"], "model.d_model", "greater than 0")
    error("negative-size", ["train", config, "train.batch_size=-4"], "train.batch_size", "-4")
    error("heads", ["train", config, "model.n_heads=3"], "n_heads (3) must divide d_model (32)")

    long_dir = root / LONG_DIR
    long_dir.mkdir(parents=True)
    missing = long_dir / "no-such-corpus-file.txt"
    error("missing-data", ["train", config, f"data.files=[{missing}]"], str(missing), "not exist")
    empty = root / "empty.txt"
    empty.write_bytes(b"")
    error("empty-data", ["train", config, f"data.files=[{empty}]"], str(empty), "empty")
    latin = root / "latin1.txt"
    latin.write_bytes(b"A fair line.\nAnother line.\nCaf\xe9 au lait.\n")
    error(
        "non-utf8-data",
        ["train", config, f"data.files=[{latin}]"],
        str(latin),
        "not UTF-8",
        "line 3",
    )
    blocker = root / "a-regular-file"
    blocker.write_text("not a folder", encoding="utf-8")
    error(
        "unwritable-output",
        ["train", config, f"train.output_dir={blocker / 'run'}", "train.max_steps=2"],
        str(blocker / "run"),
        "Cannot write",
    )
    w.procs = run_all(jobs)
    return w


@pytest.fixture(scope="module")
def work2(work: Work) -> Work:
    """Phase 2: generation from the trained runs, and damaged or occupied checkpoints."""
    root, clm = work.root, work.runs["clm"]
    assert work.procs["train-clm"].returncode == 0, explain(work.procs["train-clm"])
    jobs: dict[str, list[Any]] = {}
    for name, run in work.runs.items():
        jobs[f"generate-{name}"] = [
            "generate",
            "--checkpoint",
            run,
            "--prompt",
            PROMPT,
            "--num-samples",
            2,
            "--max-new-tokens",
            8,
        ]

    def error(name: str, args: list[Any], check: Callable[[], None] | None, *needles: str):
        jobs[name] = args
        work.errors[name] = (needles, check)

    jobs["generate-streamed"] = [
        "generate",
        "--checkpoint",
        clm / "checkpoint-30",
        "--prompt",
        PROMPT,
    ]
    jobs["generate-help"] = ["generate", "--checkpoint", work.runs["diffusion"], "--help"]
    jobs["generate-help-plain"] = ["generate", "--help"]
    error(
        "generate-clm-steps",
        ["generate", "--checkpoint", clm, "--steps", 4],
        None,
        "--steps (sample.steps) only applies to masked",
        "samples left to right. Remove --steps.",  # a flag has no preset value to restore
    )

    for flag, (args, needle) in GENERATE_FLAGS.items():
        error(
            f"generate-{flag}",
            ["generate", "--checkpoint", work.runs["diffusion"], *args],
            None,
            needle,
        )
    taken = root / "taken"
    shutil.copytree(clm, taken)
    before = {p.name: p.read_bytes() for p in taken.iterdir() if p.is_file()}

    def unchanged() -> None:
        after = {p.name: p.read_bytes() for p in taken.iterdir() if p.is_file()}
        assert after == before
        assert (taken / "model.safetensors").read_bytes() == before["model.safetensors"]

    error(
        "existing-output",
        ["train", work.config, f"train.output_dir={taken}", "train.max_steps=2"],
        unchanged,
        str(taken),
        "already holds a trained model",
        "overwrite_output_dir",
    )
    no_config = root / "no-config"
    shutil.copytree(clm, no_config)
    (no_config / "config.yaml").unlink()
    error(
        "generate-no-config",
        ["generate", "--checkpoint", no_config],
        None,
        str(no_config),
        "config.yaml",
    )
    truncated = root / "truncated"
    shutil.copytree(clm, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    error(
        "generate-truncated",
        ["generate", "--checkpoint", truncated],
        None,
        str(weights),
        "corrupted or truncated",
    )
    reshaped = root / "reshaped"
    shutil.copytree(clm, reshaped)
    cfg = yaml.safe_load((reshaped / "config.yaml").read_text())
    cfg["model"]["d_model"] = 64
    (reshaped / "config.yaml").write_text(yaml.safe_dump(cfg))
    error(
        "generate-shape-mismatch",
        ["generate", "--checkpoint", reshaped],
        None,
        "do not match the model built from its config",
        "shape mismatch",
    )
    work.procs.update(run_all(jobs))
    return work


# --- training end to end ---------------------------------------------------------------------


def test_train_end_to_end_writes_a_run_and_lowers_val_loss(work):
    proc, out = work.procs["train-clm"], work.runs["clm"]
    assert proc.returncode == 0, explain(proc)
    assert "Traceback" not in proc.stderr
    assert f"Saved the trained rack to {out}" in proc.stdout
    samples = proc.stdout.split("--- sample 1 ---", 1)[1]
    assert "--- sample 2 ---" in samples
    assert samples.replace("--- sample 2 ---", "").strip()
    for name in ("model.safetensors", "config.yaml", "metrics.jsonl", "history.json"):
        assert (out / name).is_file(), name
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert any((out / "tensorboard").glob("events.out.tfevents.*"))

    saved = load_config(out / "config.yaml")  # reloadable, with the overrides and vocab
    assert saved.train.max_steps == 60 and saved.model.vocab_size is not None
    assert json.loads((out / "history.json").read_text())["steps"] == 60
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert sorted(val) == [0, 20, 40, 60]
    assert val[60] < val[0] - 1.0, val
    assert any("train/loss" in r for r in rows)
    assert "step 20: val/loss=" in proc.stdout  # logging.console=true
    assert "--- done in " in proc.stdout and f"stackwise generate --checkpoint {out}" in proc.stdout
    assert "kernels" not in proc.stderr and "pickle protocol" not in proc.stderr


@pytest.mark.parametrize("name", ["clm", "diffusion", "mlm"])
def test_train_writes_runs_for_every_objective(work, name):
    proc = work.procs[f"train-{name}"]
    assert proc.returncode == 0, explain(proc)
    saved = load_config(work.runs[name] / "config.yaml")
    assert saved.objective.name == name
    assert (work.runs[name] / "model.safetensors").is_file()


def test_piped_output_has_no_progress_bar(work2):
    for name, proc in work2.procs.items():
        both = proc.stdout + proc.stderr
        assert "\r" not in both, (name, explain(proc))
        assert "it/s" not in both and "examples/s" not in both, (name, explain(proc))


@pytest.mark.parametrize("name", ["clm", "diffusion", "mlm"])
def test_generate_prints_text(work2, name):
    proc = work2.procs[f"generate-{name}"]
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    assert lines[0] == "--- sample 1 ---" and "--- sample 2 ---" in lines
    texts = proc.stdout.replace("--- sample 2 ---", "\x00").replace("--- sample 1 ---", "")
    for text in texts.split("\x00"):
        text = text.strip("\n")
        assert text.startswith(PROMPT), text  # the prompt is kept, then continued
        assert len(text) > len(PROMPT), text


def test_generate_streams_one_sample_from_a_checkpoint_folder(work2):
    """checkpoint-N of a run samples with the run's tokenizer; one sample is streamed."""
    proc = work2.procs["generate-streamed"]
    assert proc.returncode == 0, explain(proc)
    assert "--- sample" not in proc.stdout
    assert proc.stdout.startswith(PROMPT) and len(proc.stdout.strip()) > len(PROMPT)


def test_generate_help_explains_samplers_and_shows_the_checkpoints_defaults(work2):
    shown, plain = work2.procs["generate-help"], work2.procs["generate-help-plain"]
    assert shown.returncode == 0 and plain.returncode == 0
    saved = load_config(work2.runs["diffusion"] / "config.yaml").sample
    text = " ".join(shown.stdout.split())
    assert f"(default: {saved.temperature!r})" in text and f"(default: {saved.steps!r})" in text
    assert "(default: 'ancestral')" in text  # diffusion's sampler, resolved from 'auto'
    for sampler in ("ancestral", "remask", "single_pass"):
        assert sampler in plain.stdout
    assert "name --checkpoint before --help" in " ".join(plain.stdout.split())


# --- config ----------------------------------------------------------------------------------


def test_config_show_prints_yaml_that_reloads_equal(work):
    proc = work.procs["show"]
    assert proc.returncode == 0, explain(proc)
    shown = from_dict(yaml.safe_load(proc.stdout))
    assert shown == load_config(work.config, ["train.max_steps=7"])
    assert shown.train.max_steps == 7
    # every field is printed, defaults included
    assert "time_step_mask_fractions" in proc.stdout and "overwrite_output_dir" in proc.stdout


def test_config_validate_accepts_a_good_file(work):
    proc = work.procs["validate"]
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.strip() == "config is valid"
    assert proc.stderr == ""


# --- user errors: exit 2, one paragraph, no traceback ----------------------------------------

# generate's flags, each out of range (on the diffusion run): (args, what the message names)
GENERATE_FLAGS = {
    "temperature": (["--temperature", -1], "sample.temperature"),
    "top-p-zero": (["--top-p", 0], "sample.top_p"),
    "top-p-big": (["--top-p", 1.5], "sample.top_p"),
    "top-k": (["--top-k", -1], "sample.top_k"),
    "max-new-zero": (["--max-new-tokens", 0], "sample.max_new_tokens"),
    "max-new-over-context": (["--max-new-tokens", 1000], "does not fit"),
    "num-samples": (["--num-samples", 0], "at least 1"),
    "steps": (["--steps", 0], "sample.steps"),
    "long-prompt": (["--prompt", "the king " * 40], "never cut silently"),
}

ERROR_CASES = [
    "malformed-yaml",
    "unknown-key",
    "wrong-type",
    "zero-size",
    "negative-size",
    "heads",
    "missing-data",
    "empty-data",
    "non-utf8-data",
    "unwritable-output",
    "existing-output",
    "generate-no-config",
    "generate-truncated",
    "generate-shape-mismatch",
    "generate-clm-steps",
    *[f"generate-{flag}" for flag in GENERATE_FLAGS],
]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_user_errors_exit_2_with_one_paragraph(work2, case):
    proc = work2.procs[case]
    needles, check = work2.errors[case]
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr, explain(proc)
    message = proc.stderr.strip()
    assert message.startswith("stackwise: error: "), explain(proc)
    assert message.count("stackwise: error:") == 1 and "\n\n" not in message, explain(proc)
    flat = " ".join(message.split())
    for needle in needles:
        assert needle in flat, (needle, message)
    if check is not None:
        check()


def test_long_paths_are_not_broken_across_lines(work):
    """A path must stay copy-pasteable: the paragraph may wrap only between words."""
    proc = work.procs["missing-data"]
    path = str(work.root / LONG_DIR / "no-such-corpus-file.txt")
    assert len(path) > 100
    assert path in proc.stderr, proc.stderr


def test_unwritable_output_dir_fails_before_training(work):
    proc = work.procs["unwritable-output"]
    assert "StackWise:" not in proc.stdout  # nothing trained
    assert (work.root / "a-regular-file").read_text() == "not a folder"


def test_a_reader_that_stops_early_gets_no_traceback():
    """`stackwise config show --aliases | head -1`: the closed pipe is a normal end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackwise.cli", "config", "show", "--aliases"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


@given(st.text())
def test_printed_samples_carry_no_control_characters_but_keep_their_lines(text):
    """A byte-level model can emit ESC sequences; printed samples show them escaped."""
    from stackwise.cli.common import printable

    shown = printable(text)
    assert not any((ord(c) < 32 and c not in "\n\t") or 127 <= ord(c) < 160 for c in shown)
    assert shown.count("\n") == text.count("\n")
    plain = "".join(c for c in text if c in "\n\t" or 32 <= ord(c) < 127 or ord(c) >= 160)
    assert printable(plain) == plain


def test_an_unknown_flag_gets_the_commands_usage_and_the_nearest_flag(tmp_path, capsys):
    from stackwise.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["generate", "--checkpoint", str(tmp_path), "--temprature", "0.5", "--num_samples"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "usage: stackwise generate" in err
    assert "--temprature: did you mean --temperature?" in err
    assert "--num_samples: did you mean --num-samples?" in err
