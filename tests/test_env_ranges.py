"""`stackwise env` names an installed library outside the range pyproject.toml declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from stackwise.envreport import collect, out_of_range, render

PINNED = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "datasets", "tokenizers")
PINNED += ("tiktoken", "safetensors", "pydantic")


def test_versions_outside_the_declared_ranges_are_named():
    installed = {"transformers": "5.25.1", "peft": "0.21.2", "torch": "2.13.0+cpu"}
    requires = [
        "transformers>=5.0,<5.25",
        "peft>=0.13,<0.22",
        "torch>=2.5,<2.14",
        "missing-lib>=1",
        'wandb>=0.17; extra == "dev"',  # an optional extra: not checked
    ]
    lines = out_of_range(requires, lambda name: installed.get(name, "not installed"))
    joined = " ".join(" ".join(lines).split())
    assert len(lines) == 2
    assert "transformers 5.25.1 is outside the range" in joined and "<5.25" in joined
    assert "missing-lib is not installed" in joined


def test_pyproject_bounds_the_libraries_we_touch_and_env_reports_the_check():
    """Each library whose internals StackWise relies on has an upper bound, and the report
    carries the range check (the installed versions are inside their ranges here)."""
    project = tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())
    reqs = {Requirement(r).name: Requirement(r) for r in project["project"]["dependencies"]}
    for name in PINNED:
        assert any(s.operator == "<" for s in reqs[name].specifier), name
    declared = [str(r) for r in reqs.values()]
    assert out_of_range(declared) == []
    assert "declared ranges:" in render(collect())


def test_a_checkout_newer_than_its_install_is_checked_from_its_pyproject(tmp_path):
    """An editable install keeps its last metadata: the checkout's pyproject.toml is what the
    ranges are checked against, and the report says to reinstall."""
    from stackwise.envreport import _source_requirements

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch>=2.5,<2.14", "peft>=0.13,<0.22"]\n')
    old = ["torch>=2.5", "peft>=0.13", 'wandb>=0.17; extra == "dev"']
    requires, note = _source_requirements(old, pyproject)
    assert requires == ["torch>=2.5,<2.14", "peft>=0.13,<0.22"]
    assert len(note) == 1 and "pip install -e ." in note[0]
    same = ["torch<2.14,>=2.5", "peft<0.22,>=0.13", 'wandb>=0.17; extra == "dev"']
    assert _source_requirements(same, pyproject) == (requires, [])
    assert _source_requirements(old, tmp_path / "none.toml") == (old, [])  # a wheel install
