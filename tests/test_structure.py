"""The package keeps its architecture: layers, no import cycles, small modules and functions
(tools/structure.py, also `make structure`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def test_the_package_has_no_structure_problems():
    path = Path(__file__).resolve().parents[1] / "tools" / "structure.py"
    spec = importlib.util.spec_from_file_location("structure", path)
    assert spec is not None and spec.loader is not None
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    assert structure.find_problems() == []
