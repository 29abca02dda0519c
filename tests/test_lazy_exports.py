"""Package names that load on first use: the same objects as the modules', a clear error for
a name that is not there, and importing one module of a package leaves the others unloaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stackwise
import stackwise.progressive
import stackwise.quant
from stackwise.lazy_exports import lazy_exports


def test_each_exported_name_is_its_modules_object_and_listed():
    from stackwise.progressive.recipe import ProgressiveRecipe
    from stackwise.quant.lora import rank_for

    assert stackwise.progressive.ProgressiveRecipe is ProgressiveRecipe
    assert stackwise.quant.rank_for is rank_for
    assert "ProgressiveRecipe" in dir(stackwise.progressive) and "Rack" in dir(stackwise)
    assert "__version__" in dir(stackwise) and "__version__" in stackwise.__all__


@pytest.mark.parametrize("package", [stackwise, stackwise.progressive, stackwise.quant])
def test_every_listed_name_resolves(package):
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    import stackwise.progressive.budget  # a submodule stays visible to dir()

    assert "budget" in dir(stackwise.progressive) and "__name__" in dir(stackwise.quant)


def test_an_unknown_name_fails_naming_the_package():
    with pytest.raises(AttributeError, match=r"module 'stackwise\.quant' has no attribute 'nf5'"):
        stackwise.quant.nf5  # noqa: B018


def test_a_name_is_looked_up_once_then_kept():
    namespace: dict = {}
    getattr_, dir_, names = lazy_exports("pkg", namespace, {"math": ("tau",), "os": ("sep",)})
    assert names == ["sep", "tau"] and dir_() == ["sep", "tau"]
    import math

    assert getattr_("tau") == math.tau and namespace["tau"] == math.tau


def test_importing_the_plans_modules_leaves_the_recipe_and_quantization_unloaded():
    code = (
        "import sys\n"
        "import stackwise.progressive.budget, stackwise.quant.lora\n"
        "heavy = ('stackwise.progressive.builder', 'stackwise.growth', 'stackwise.quant.layers')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
