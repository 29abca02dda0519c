"""The package keeps its architecture: layers, no import cycles, small modules and functions
(tools/structure.py, also `make structure`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _checker():
    path = Path(__file__).resolve().parents[1] / "tools" / "structure.py"
    spec = importlib.util.spec_from_file_location("structure", path)
    assert spec is not None and spec.loader is not None
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    return structure


def test_the_package_has_no_structure_problems():
    assert _checker().find_problems() == []


def test_a_module_imported_from_its_package_counts_as_that_module():
    """`from stackwise import pipeline` inside the model layer is an upward import."""
    import ast

    structure = _checker()
    code = "from stackwise import pipeline, seeds\nfrom stackwise.config import Config"
    found = structure.imports(ast.parse(code), "stackwise.model.rack", False)
    assert found == {"stackwise.pipeline", "stackwise.seeds", "stackwise.config"}
    assert structure.layer("stackwise.pipeline") > structure.layer("stackwise.model.rack")


ENTRY_CASES = {  # command line -> what it prints (stdout for help, else the error)
    "help": (["--help"], "usage: stackwise"),
    "version": (["--version"], "stackwise"),
    "train-help": (["train", "--help"], "usage: stackwise train"),
    "config-show": (["config", "show", "tiny-clm"], "d_model"),
    "config-validate": (["config", "validate", "tiny-clm"], "valid"),
    "train-bad-value": (["train", "tiny-clm", "train.lr=abc"], "train.lr"),
    "train-no-config": (["train", "no-such-config.yaml"], "no-such-config.yaml"),
    "lr-find-bad-value": (["lr-find", "tiny-clm", "train.lr=abc"], "train.lr"),
    "lr-find-bad-range": (["lr-find", "tiny-clm", "--min-lr", "1", "--max-lr", "0.1"], "--min-lr"),
    "lr-find-deepspeed": (  # without the extra, the config asks for it first
        ["lr-find", "tiny-clm", "parallel.strategy=deepspeed"],
        "ddp or fsdp"
        if importlib.util.find_spec("deepspeed")
        else "an optional extra that is not installed",
    ),
    "generate-no-run": (["generate", "--checkpoint", "no-such-run", "--prompt", "a"], "not exist"),
    "eval-no-run": (["eval", "--checkpoint", "no-such-run"], "does not exist"),
    "finetune-bad-flag": (["finetune", "not-a-flag"], "not-a-flag"),
    "report-no-run": (["report", "no-such-run"], "does not exist"),
}


@pytest.mark.parametrize("case", list(ENTRY_CASES))
def test_the_command_answers_help_and_refuses_a_bad_config_without_loading_torch(case, tmp_path):
    """The `stackwise` process itself (its entry point, as a user runs it): help, config
    commands, a refused config and a mistyped run folder must not import torch, which costs
    seconds and 200 MB."""
    import subprocess
    import sys

    args, said = ENTRY_CASES[case]
    code = (
        "import atexit, sys; from stackwise.cli import run; "
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules)); "
        f"sys.argv = ['stackwise', *{args!r}]; run()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode in (0, 2), out.stderr
    assert said in out.stdout + out.stderr, out.stdout[-300:] + out.stderr
    assert out.stdout.strip().splitlines()[-1] == "torch loaded: False", out.stdout[-300:]


def test_the_checker_finds_config_below_the_door_and_trainer_subclasses(tmp_path):
    """The two rules of issue 29 bite: a model module reading the config, a Trainer subclass."""
    import ast

    structure = _checker()
    assert structure.is_config("stackwise.config.sections")
    assert not structure.is_config("stackwise.configure")
    tree = ast.parse("class Mine(Trainer): ...\nclass Fine(TrainingStrategy): ...")
    assert structure.trainer_subclasses(tree, "stackwise.x") == [
        "stackwise.x.Mine inherits from the Trainer"
    ]


def test_every_recipe_names_a_test_that_exists():
    """docs/architecture.md backs each recipe with a test; the names must be real."""
    import re

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b(test_\w+)(?![\w.])", doc))  # not the tests/test_x.py files
    defined = set()
    for path in (root / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    assert len(named) >= 10
    assert named <= defined, sorted(named - defined)
