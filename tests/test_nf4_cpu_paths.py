"""NF4 on every CPU: both bitsandbytes CPU paths are forced on every machine, and the effective
weights never change through eval, state_dict, save and reload, for any layer shape."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from torch import nn

from stackwise.cli import main
from stackwise.io.merge import probe_logits
from stackwise.pipeline import train_from_config
from stackwise.quant.layers import dequantized_weight, load_quantized_state, quantize_linears
from stackwise.runs import load_trained


def linears(shapes: list[tuple[int, int]], seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Linear(i, o) for i, o in shapes))


def effective(module: nn.Module) -> list[torch.Tensor]:
    return [dequantized_weight(m).clone() for m in module if hasattr(m, "weight")]


def test_the_forced_avx512_path_is_really_taken(monkeypatch):
    """The control: an unpinned bitsandbytes layer under the forced flag does repack in eval,
    so the tests below exercise the path that used to corrupt weights."""
    import bitsandbytes as bnb
    import bitsandbytes.nn.modules as bnb_modules

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)
    raw = bnb.nn.Linear4bit(128, 64, compute_dtype=torch.float32, quant_type="nf4").to("cpu")
    raw.eval()
    # on AVX2 machines bitsandbytes has no kernel for the repacked layout, so the forward may
    # then fail; what this test checks is that the repack itself happened
    with torch.no_grad(), contextlib.suppress(Exception):
        raw(torch.randn(2, 128))
    assert raw.weight.quant_state.packing_format_for_cpu


@pytest.mark.parametrize("double_quant", [False, True])
def test_nf4_weights_are_bit_identical_through_eval_state_dict_save_and_reload(
    bnb_cpu_path, double_quant, tmp_path
):
    # the shapes of our presets and tests, including ones below the 64-wide quantization block
    # and out_features that are not multiples of 32
    shapes = [(32, 32), (32, 86), (86, 32), (128, 344), (344, 128), (192, 128), (64, 48)]
    model = linears(shapes)
    quantize_linears(model, "nf4", double_quant)
    before = effective(model)
    x = torch.randn(5, 32)
    model.eval()
    with torch.no_grad():  # eval without gradients: where bitsandbytes used to repack
        out_eval = model[:3](x)
    model.train()
    out_train = model[:3](x.requires_grad_())
    assert torch.allclose(out_eval, out_train, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(before, effective(model), strict=True))

    save_file(model.state_dict(), tmp_path / "nf4.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(before, effective(model), strict=True))
    fresh = linears(shapes, seed=1)
    quantize_linears(fresh, "nf4", double_quant)
    load_quantized_state(fresh, load_file(tmp_path / "nf4.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(before, effective(fresh), strict=True))
    fresh.eval()
    with torch.no_grad():
        assert torch.allclose(fresh[:3](x), out_eval, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    in_f=st.sampled_from([1, 2, 3, 31, 63, 64, 65, 127, 200]) | st.integers(1, 160),
    out_f=st.sampled_from([1, 2, 31, 32, 33, 86, 344]) | st.integers(1, 160),
    packed=st.booleans(),
)
@example(in_f=1, out_f=2, packed=False)  # bitsandbytes returns such a weight transposed
def test_any_shape_computes_with_its_dequantized_weight(in_f, out_f, packed):
    import bitsandbytes.nn.modules as bnb_modules

    original = bnb_modules.has_avx512bf16
    bnb_modules.has_avx512bf16 = lambda: packed
    try:
        model = linears([(in_f, out_f)])
        quantize_linears(model, "nf4")
    finally:
        bnb_modules.has_avx512bf16 = original
    (w,) = effective(model)
    x = torch.randn(3, in_f)
    model.eval()
    with torch.no_grad():
        got = model(x)
    assert torch.allclose(got, x @ w.T + model[0].bias, rtol=1e-5, atol=1e-5)
    assert torch.equal(dequantized_weight(model[0]), w)


def test_qlora_run_eval_save_reload_and_merge_on_both_paths(bnb_cpu_path, tiny, tmp_path, capsys):
    cfg = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        train={"max_steps": 600, "eval_every": 2},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": 3,
            "new_stack_precision": "nf4",
            "trunk_strategy": "qlora",
        },
        lora={"enabled": True, "trunk_adapters": True},
        quant={"enabled": True, "type": "nf4"},
    )
    res = train_from_config(cfg, quiet=True)  # evals (no grad) and saves stacks on the way
    adapted = probe_logits(cfg, res.rack.eval())
    _, reloaded, _ = load_trained(res.output_dir)
    assert torch.allclose(probe_logits(cfg, reloaded), adapted, rtol=1e-6, atol=1e-6)
    out = tmp_path / "merged"
    assert main(["merge-lora", str(res.output_dir), str(out)]) == 0
    assert "warning" not in capsys.readouterr().err  # an exact merge: nothing to warn about
    _, merged, _ = load_trained(out)
    # merged onto the exactly dequantized base: only fp32 rounding separates them
    assert (probe_logits(cfg, merged) - adapted).abs().max() < 1e-4
