"""The package keeps its architecture: layers, no import cycles, small modules and functions
(tools/structure.py, also `make structure`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


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


def test_the_cli_answers_help_without_loading_torch():
    """`stackwise --help`, `--version` and `config show` must not import torch (~1-4 s)."""
    import subprocess
    import sys

    code = (
        "import sys, stackwise.cli as c; c.build_parser(); "
        "from stackwise.config import load_config; load_config(None, []); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
