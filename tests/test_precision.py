"""One precision vocabulary: the config's choices, the builder, the quantizer, stack files and
the cache all take their names from stackwise.precision."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import torch

from stackwise import precision
from stackwise.config import Config
from stackwise.config.growth import QUANTIZED

PACKAGE = Path(precision.__file__).parent


def literal_choices(model, path: str) -> tuple[str, ...]:
    *sections, name = path.split(".")
    for sec in sections:
        model = model.model_fields[sec].annotation
    return typing.get_args(model.model_fields[name].annotation)


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("train.mixed_precision", precision.get_args(precision.MixedPrecision)),
        ("progressive.new_stack_precision", precision.STACK_PRECISIONS),
        ("quant.type", precision.QUANT_TYPES),
        ("progressive.cache.dtype", precision.HALF_FLOATS),
    ],
)
def test_the_config_offers_exactly_the_vocabulary(path, names):
    assert literal_choices(Config, path) == names


def test_no_module_spells_out_its_own_dtype_table_or_name_list():
    own = re.compile(r'"(bf16|fp16)":\s*torch\.|\("nf4", "fp8", "nvfp4"')
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "precision.py" and own.search(p.read_text())
    ]
    assert offenders == []


def test_dtypes_and_packed_formats():
    assert precision.torch_dtype("full") is torch.float32
    assert precision.torch_dtype("bf16") is torch.bfloat16
    assert precision.torch_dtype("fp16") is torch.float16
    with pytest.raises(ValueError, match="not a floating-point precision"):
        precision.torch_dtype("nf4")
    assert set(QUANTIZED) == set(precision.PACKED) and precision.PACKED["qlora"] == "nf4"
    assert set(precision.PACKED.values()) == set(precision.QUANT_FORMATS)
