"""The README and the docs pages its text moved to, followed: every command of their ```bash
blocks and every ```python snippet runs, with shrunk budgets, in a temporary folder, and must
exit 0.

A command that cannot run in a test is listed in SKIP with the reason; a block holding a
command that is neither run nor listed fails, so a new claim cannot drift in unchecked.
Commands run in this process (`stackwise.cli.main`, no torch import per command), except those
with an environment prefix (`PYTHONPATH=. stackwise ...`), which run as a subprocess the way a
shell would run them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_corpus
from hf_fixtures import chat_file, tiny_hf

import stackwise
from stackwise.cli import main
from stackwise.cli.common import load_args
from stackwise.config import Config, load_config

ROOT = Path(__file__).parents[1]
# the pages followed, as one text: the README and the user guide (not docs/distributed.md,
# whose launches start several processes, nor docs/benchmarks.md: benchmarks take minutes)
GUIDE = "quickstart cli configuration growth diffusion finetuning moe reliability troubleshooting"
PAGES = ["README.md", *(f"docs/{n}.md" for n in [*GUIDE.split(), "python_api", "development"])]
TEXT = "\n\n".join((ROOT / page).read_text(encoding="utf-8") for page in PAGES)

# first word of a command -> why the test does not run it
SKIP = {
    "make": "creates the venv and trains the full default preset (minutes), or runs the suite",
    "tensorboard": "a server that runs until stopped",
    ".": "activates the venv in the user's shell; this test runs that venv's stackwise",
    "torchrun": "starts several processes",
    "pip": "changes the environment",
}
# blocks written to a file (the page names the file right before the block)
WRITTEN = {
    "grad_watch.py": "Save this as `grad_watch.py`:",
    "ft.yaml": "The same run as a YAML config, `ft.yaml`, for",
}
ENV_ASSIGN = re.compile(r"[A-Z_][A-Z0-9_]*=.*")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[tuple[str, str]]:
    """(id, text) of each block of `lang`; the id names the section and the block's place."""
    out, seen = [], {}
    for m in FENCE.finditer(TEXT):
        if m.group(1) != lang:
            continue
        prose = FENCE.sub("", TEXT[: m.start()])  # a `# comment` in a block is no heading
        heads = re.findall(r"^#+ (.+)$", prose, re.M)
        head = re.sub(r"\W+", "-", heads[-1] if heads else "top").strip("-").lower()
        seen[head] = seen.get(head, 0) + 1
        out.append((f"{head}-{seen[head]}", m.group(2)))
    return out


def block_after(phrase: str) -> str:
    """The first fenced block after `phrase` in the pages."""
    at = TEXT.index(phrase)
    match = FENCE.search(TEXT, at)
    assert match is not None, phrase
    return match.group(2)


def commands(text: str) -> list[list[str]]:
    """A block's commands as argv lists: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def shrink_overrides(cfg: Config, root: Path, grow: int | None = 2) -> list[str]:
    """Overrides that make a run of `cfg` take seconds: a tiny model on a tiny corpus, one or
    two steps (per stack when it grows, to `grow` stacks), few short samples."""
    if cfg.model.source == "hf":
        return ["train.num_train_epochs=null", "train.max_steps=1", "train.batch_size=2"]
    out = [f"data.files=[{root / 'corpus.txt'}]", f"data.cache_dir={root / 'cache'}"]
    out += ["model.d_model=32", "model.n_heads=2", "model.max_seq_len=32", "data.seq_len=32"]
    out += ["train.batch_size=4", "train.eval_batches=1", "train.warmup_steps=0"]
    out += ["sample.num_samples=1", "sample.max_new_tokens=8"]
    if cfg.data.tokenizer is None:
        out.append("data.bpe_vocab_size=300")
    if cfg.objective.name != "clm":
        out.append("sample.steps=4")
    if cfg.train.save_steps:
        out.append("train.save_steps=1")
    if cfg.progressive.strategy == "progressive":
        out += [f"model.n_stacks={grow}"] if grow else []
        if cfg.progressive.growth.schedule == "budget_share":  # stack k weighs k + 1
            n = grow or cfg.model.n_stacks
            return [*out, f"train.max_steps={n * (n + 1) // 2}"]  # 1, 2, ... steps
        return [*out, "progressive.steps_per_stack=1", "progressive.stacks.0.steps=1"]
    return [*out, "train.max_steps=2", "train.eval_every=2"]


def shrunk(argv: list[str], root: Path, run: str) -> list[str]:
    """A documented command (after `stackwise`) with its budget shrunk."""
    argv = [a.replace("<run>", run) for a in argv]
    cmd = argv[0]
    if cmd in ("train", "lr-find"):
        extra = shrink_overrides(load_args([a for a in argv[1:] if not a.startswith("-")]), root)
        if not any(a.startswith("train.output_dir=") for a in argv):
            extra.append(f"train.output_dir=outputs/{run}")
        return [*argv, *extra]
    if cmd == "finetune":  # its step budget replaced: flag and override would be rivals
        budget = ("--num_train_epochs", "--max_steps")
        kept = [a for i, a in enumerate(argv) if a not in budget and argv[i - 1] not in budget]
        return [*kept, "--max_steps", "1", "train.batch_size=2", "sample.max_new_tokens=4"]
    if cmd == "eval":
        return [*argv, "--samples", "1", "--t-points", "2", "--mc-num", "1", "--max-blocks", "2"]
    if cmd == "generate":
        return [*argv, "--max-new-tokens", "8"]
    return argv


def interrupted(root: Path, argv: list[str]) -> None:
    """Before a resume: the run it resumes stopped early (a finished run is not resumed)."""
    out = next(a.split("=", 1)[1] for a in argv if a.startswith("train.output_dir="))
    (root / out / "run_complete.json").unlink()


def extension_ran(root: Path, run: str) -> None:
    """The extension written in grad_watch.py counted the steps into the checkpoint."""
    state = json.loads((root / "outputs" / run / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["extensions"]["grad_watch"] == {"steps": 2}


# a piece of a command -> what must happen before it runs
BEFORE: dict[str, Callable[[Path, list[str]], None]] = {
    "train.resume_from_checkpoint=latest": interrupted,
}
# a piece of a command -> what must hold after it ran
AFTER: dict[str, Callable[[Path, str], None]] = {"grad_watch:grad_watch": extension_ran}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the pages' commands name: a corpus, ./my-llama, chat rows, configs/, the
    blocks the pages say to save, and the default run (`make train`, shrunk)."""
    root = tmp_path_factory.mktemp("readme")
    (root / "corpus.txt").write_text(make_corpus(), encoding="utf-8")
    tiny_hf(root / "my-llama")
    chat_file(root / "chat.jsonl", n=8)
    chat_file(root / "eval.jsonl", n=4, seed=5)
    (root / "configs").symlink_to(ROOT / "configs")
    for name, phrase in WRITTEN.items():
        (root / name).write_text(block_after(phrase), encoding="utf-8")
    cwd = Path.cwd()
    os.chdir(root)
    try:
        # `make train` runs `stackwise train`; checkpoints too, to check where they go
        assert main(shrunk(["train", "train.save_steps=2"], root, "default")) == 0
    finally:
        os.chdir(cwd)
    return root


def bare(argv: list[str]) -> list[str]:
    """A command without its leading environment assignments (`PYTHONPATH=. stackwise ...`)."""
    i = 0
    while i < len(argv) and ENV_ASSIGN.fullmatch(argv[i]):
        i += 1
    return argv[i:]


def run_command(argv: list[str], root: Path, run: str) -> None:
    env = {}
    while argv and ENV_ASSIGN.fullmatch(argv[0]):
        key, value = argv.pop(0).split("=", 1)
        env[key] = value
    argv = shrunk(argv[1:], root, run)
    for piece, before in BEFORE.items():
        if piece in argv:
            before(root, argv)
    if env:
        proc = subprocess.run(
            [sys.executable, "-m", "stackwise.cli", *argv],
            cwd=root,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    else:
        assert main(argv) == 0, argv
    for piece, after in AFTER.items():
        if piece in argv:
            after(root, run)


@pytest.mark.parametrize(("block", "text"), blocks("bash"), ids=[i for i, _ in blocks("bash")])
def test_every_bash_block_runs(block: str, text: str, workspace: Path, monkeypatch):
    """Each command of the block runs (or is in SKIP); a block that trains names its own run
    folder, and `outputs/<run>` elsewhere is the default run."""
    monkeypatch.chdir(workspace)
    argvs = commands(text)
    trains = any(bare(a)[:2] == ["stackwise", "train"] for a in argvs)
    run = block if trains else "default"
    for argv in argvs:
        word = bare(argv)[0]
        if word in SKIP:
            continue
        assert word == "stackwise", (
            f"documented command {shlex.join(argv)!r} is neither run by this test nor listed in "
            "SKIP with a reason"
        )
        run_command(list(argv), workspace, run)


def test_python_blocks_run(workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """Each ```python snippet that is not saved as a file runs, its configs shrunk."""
    monkeypatch.chdir(workspace)

    def small_config(path: Any = None, overrides: list[str] | None = None) -> Config:
        cfg = load_config(path, overrides)  # the snippet grows all its stacks: keep them
        return load_config(path, [*(overrides or []), *shrink_overrides(cfg, workspace, None)])

    monkeypatch.setattr(stackwise, "load_config", small_config, raising=False)
    written = {block_after(phrase) for phrase in WRITTEN.values()}
    snippets = [t for _, t in blocks("python") if t not in written]
    assert snippets
    for text in snippets:
        exec(compile(text, "docs", "exec"), {"__name__": "readme"})


def test_the_fine_tune_yaml_is_the_run_its_flags_give(workspace: Path, monkeypatch):
    """docs/finetuning.md: the YAML config resolves to the very config of the seed's command
    line."""
    from stackwise.cli.finetune import finetune_config

    monkeypatch.chdir(workspace)
    (flags,) = [a for a in commands(block_after("The seed's command line:")) if a[1] == "finetune"]
    assert finetune_config(flags[2:]) == load_config("ft.yaml")


def test_the_presets_named_are_the_presets_that_exist():
    section = TEXT[TEXT.index("Presets live in") : TEXT.index("Overrides are")]
    named = set(re.findall(r"`(tiny-[\w-]+)`", section))
    assert named == {p.stem for p in (ROOT / "stackwise" / "presets").glob("*.yaml")}


def documented_layout(kind: str) -> set[str]:
    line = TEXT[TEXT.index(f"- **{kind}**:") :].split("\n- ", 1)[0].split("\n\n", 1)[0]
    return {n.rstrip("/") for n in re.findall(r"`([^`]+)`", line)}


def test_what_a_run_writes_matches_real_runs(workspace: Path):
    """docs/reliability.md's layouts against the default (progressive) run and an end-to-end
    one."""
    prog = workspace / "outputs" / "default"
    top = {re.sub(r"^stack_\d+$", "stack_<k>", p.name) for p in prog.iterdir()}
    top -= {"eval.json", "eval_samplers.json"}  # written by the documented `stackwise eval`
    inner = {p.name for p in (prog / "stack_0").iterdir()} - {".stackwise.lock"}
    assert {"checkpoint-1", "latest"} <= inner  # a stage's checkpoints are in stack_<k>/
    assert documented_layout("Progressive") == top | inner - {"checkpoint-1", "latest"}
    e2e = workspace / "e2e"
    args = ["tiny-clm", "train.save_steps=2", f"train.output_dir={e2e}"]
    assert main(["train", *args, *shrink_overrides(load_args(args), workspace)]) == 0
    found = {p.name for p in e2e.iterdir()}
    assert {"checkpoint-1", "checkpoint-2", "latest"} <= found
    assert documented_layout("End to end") == found - {"checkpoint-1", "checkpoint-2", "latest"}


def test_the_cli_synopsis_names_real_commands_and_flags():
    """The ```text synopsis of docs/cli.md: each subcommand (and action of `config`/`data`)
    exists and takes the flags shown."""
    from stackwise.cli.commands import generate_help_defaults
    from stackwise.cli.parsers import build_parser

    parser = build_parser(generate_help_defaults([]))
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for line in re.sub(r"\n\s+\[", " [", block_after("## Synopsis")).splitlines():
        words = line.split("#")[0].split()
        if len(words) < 2 or words[1].startswith("-") or words[1] == "finetune":
            continue  # finetune's flags are config keys, checked in test_finetune_cli
        sub = subs[words[1]]
        actions = {c for a in sub._actions if not a.option_strings for c in a.choices or ()}
        assert not actions or words[2] in actions, line
        known = {o for a in sub._actions for o in a.option_strings}
        for flag in re.findall(r"(--[a-z][\w-]*)", line):
            assert flag in known, f"{words[1]}: {flag}"
