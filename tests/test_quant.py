"""Quantized storage and LoRA: formats against references, stored bytes, gradients through frozen
quantized layers, dual adapters in progressive runs, rank strategies, YAML runs, merging."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from stackwise.cli import main
from stackwise.config import load_config
from stackwise.data.pack import build_data
from stackwise.errors import StackWiseError
from stackwise.io.merge import probe_logits
from stackwise.pipeline import progressive_recipe, resolve_vocab, train_from_config
from stackwise.quant.formats import (
    E2M1_VALUES,
    dequantize_fp8,
    dequantize_nvfp4,
    quantize_fp8,
    quantize_nvfp4,
)
from stackwise.quant.layers import dequantized_weight, nf4_linear, quantize_linears, weight_bytes
from stackwise.quant.lora import add_adapter, rank_for, set_adapter_trainable
from stackwise.runs import load_trained
from stackwise.spec import AdapterSpec, MemorySpec, ModelSpec, Plan, ProgressiveSpec

# every finite e4m3 value, from its bit patterns: an independent reference for fp8 rounding
E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
E4M3 = E4M3[torch.isfinite(E4M3)].unique()


def nearest(values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return grid[(values[..., None] - grid).abs().argmin(-1)]


def weights(out_f: int = 48, in_f: int = 80, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rows = torch.logspace(-3, 1, out_f)[:, None]  # rows of very different magnitude
    return torch.randn(out_f, in_f, generator=gen) * rows


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# -- 1. formats against references -----------------------------------------------------------


def test_fp8_rounds_each_row_to_the_nearest_e4m3_value():
    w = weights()
    codes, scale = quantize_fp8(w)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (w.shape[0],)
    expected = nearest(w / scale[:, None], E4M3) * scale[:, None]
    got = dequantize_fp8(codes, scale, torch.float32)
    assert torch.allclose(got, expected, rtol=1e-6, atol=0)
    assert rel_err(got, w) < 0.04  # 3 mantissa bits


def test_nvfp4_matches_a_direct_block_by_block_reference():
    w = weights(24, 72)  # 72 is not a multiple of 16: the last block is zero-padded
    packed, block_scale, tensor_scale = quantize_nvfp4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (24, 40)  # 80 padded codes / 2
    assert block_scale.dtype == torch.float8_e4m3fn and block_scale.shape == (24, 5)
    got = dequantize_nvfp4(packed, block_scale, tensor_scale, torch.float32, 72)
    grid = torch.cat([-E2M1_VALUES.flip(0), E2M1_VALUES])
    ts = w.abs().max() / (6 * 448)
    expected = torch.empty_like(w)
    for r in range(w.shape[0]):
        for c0 in range(0, 72, 16):
            block = w[r, c0 : c0 + 16]
            bs = nearest((block.abs().max() / 6 / ts).reshape(1), E4M3)[0]
            expected[r, c0 : c0 + 16] = nearest(block / (bs * ts), grid) * bs * ts
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-12)
    assert rel_err(got, w) < 0.15


def test_nf4_is_bitsandbytes_own_quantizer():
    import bitsandbytes.functional as bf

    w = weights(64, 128)
    lin = nn.Linear(128, 64, bias=False)
    lin.weight.data.copy_(w)
    packed, state = bf.quantize_4bit(w, quant_type="nf4")
    reference = bf.dequantize_4bit(packed, state)
    ours = dequantized_weight(nf4_linear(lin))
    assert torch.equal(ours, reference.float())
    assert rel_err(ours, w) < 0.15


@pytest.mark.parametrize(
    ("fmt", "double_quant", "low", "high"),
    [
        ("fp8", False, 1.0, 1.01),  # 1 byte + a 4-byte scale per 512-wide row
        ("nvfp4", False, 0.5625, 0.57),  # half a byte + 1 byte per 16 + one fp32
        ("nf4", False, 0.5625, 0.57),  # half a byte + an fp32 absmax per 64
        ("nf4", True, 0.5, 0.53),  # absmax stored as 8 bits
    ],
)
def test_stored_bytes_per_parameter(fmt, double_quant, low, high):
    layer = nn.Sequential(nn.Linear(512, 256, bias=False))
    stored, params = weight_bytes(layer)
    assert stored / params == 4.0
    quantize_linears(layer, fmt, double_quant)
    stored, params = weight_bytes(layer)
    assert params == 512 * 256
    assert low <= stored / params <= high, stored / params
    on_disk = sum(t.numel() * t.element_size() for t in layer.state_dict().values())
    assert on_disk / params <= high + 0.01  # what is saved is what we counted


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", "nf4"])
def test_lora_trains_through_a_frozen_quantized_layer(fmt):
    torch.manual_seed(0)
    m = Attn()
    quantize_linears(m, fmt)
    base = {k: v.clone() for k, v in m.state_dict().items()}
    add_adapter(m, "stack", AdapterSpec(rank=4, alpha=8))
    set_adapter_trainable(m, "stack", True)
    trainable = {n: p for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    start = {n: p.detach().clone() for n, p in trainable.items()}
    opt = torch.optim.SGD(trainable.values(), lr=0.5)
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    w = dequantized_weight(m.q_proj.base_layer)
    assert torch.allclose(m(x), x @ w.t() + m.q_proj.base_layer.bias, atol=1e-5)  # B = 0
    losses = []
    for _ in range(3):
        loss = (m(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(not torch.equal(start[n], p) for n, p in trainable.items())  # A and B move
    after = m.q_proj.base_layer.state_dict()
    for k, v in base.items():
        assert torch.equal(after[k.removeprefix("q_proj.")], v), k  # frozen codes untouched


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", "nf4"])
def test_backward_never_keeps_a_dequantized_weight(fmt):
    """The memory saving must hold while training: autograd may save activations and codes,
    but no full-precision copy of the frozen weight."""
    m = Attn()
    quantize_linears(m, fmt)
    add_adapter(m, "stack", AdapterSpec(rank=4, alpha=8))
    set_adapter_trainable(m, "stack", True)
    saved: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x = torch.randn(3, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        m(x).sum().backward()
    weight_sized = [t for t in saved if t.is_floating_point() and t.numel() == 32 * 32]
    assert weight_sized == []
    assert x.grad is not None and torch.isfinite(x.grad).all()


# -- 2/3. config keys, dual LoRA, ranks ------------------------------------------------------

QLORA = {
    "model": {"n_stacks": 3, "blocks_per_stack": 1},
    "objective": {"name": "diffusion"},
    "train": {"max_steps": 600},
    "progressive": {
        "strategy": "progressive",
        "steps_per_stack": 3,
        "trunk_strategy": "qlora",
        "new_stack_precision": "qlora",
    },
    "lora": {"enabled": True, "rank": 4, "alpha": 8, "trunk_adapters": True, "trunk_rank": 2},
    "quant": {"enabled": True, "type": "nf4"},
}


def test_seed_flat_names_are_documented_aliases(tiny):
    nested = tiny(**QLORA)
    flat = tiny(
        model=QLORA["model"],
        objective=QLORA["objective"],
        train={"max_steps": 600, "mixed_precision": "no"},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": 3,
            "trunk_strategy": "qlora",
            "new_stack_precision": "qlora",
            "qlora_enabled": True,
            "qlora_rank": 4,
            "qlora_alpha": 8,
            "progressive_qlora": True,
            "progressive_qlora_rank": 2,
            "quantization_enabled": True,
            "quantization_type": "nf4",
        },
    )
    assert flat == nested
    fp8 = {**QLORA, "progressive": {**QLORA["progressive"], "new_stack_precision": "fp8"}}
    assert tiny(**{**fp8, "quant": {"enabled": True, "type": "nf_fp8"}}).quant.type == "fp8"
    with pytest.raises(StackWiseError, match="keep one"):
        tiny(**{**QLORA, "progressive": {**QLORA["progressive"], "qlora_rank": 8}})


@pytest.mark.parametrize(
    ("lora", "prog", "match"),
    [
        ({"enabled": True, "trunk_rank": 2}, {}, "needs lora.trunk_adapters"),
        ({}, {"new_stack_precision": "nf4"}, "lora.enabled: true"),
        ({}, {"trunk_strategy": "qlora"}, "memory-light"),
        (
            {"enabled": True, "trunk_adapters": True},
            {"cache": {"enabled": True}},
            "cannot be cached",
        ),
        ({"rank": 16}, {}, "needs lora.enabled"),
    ],
)
def test_lora_settings_that_would_do_nothing_are_refused(tiny, lora, prog, match):
    with pytest.raises(StackWiseError, match=match):
        tiny(
            model={"n_stacks": 2, "blocks_per_stack": 1},
            objective={"name": "diffusion"},
            progressive={"strategy": "progressive", **prog},
            lora=lora,
        )


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"progressive": {"new_stack_precision": "fp8"}, "quant": {"type": "nf4"}}, "never apply"),
        ({"progressive": {"new_stack_precision": "bf16"}, "quant": {"type": "bf16"}}, "nothing"),
        (
            {
                "progressive": {"trunk_strategy": "qlora"},
                "lora": {"trunk_adapters": True},
                "quant": {"backbone_quantized": False},
            },
            "contradicts",
        ),
        ({"model": {"n_stacks": 1}}, "never is one"),
        (
            {"progressive": {"mode": "fused", "joint_tuning_steps": 2}, "quant": {"type": "fp16"}},
            "loss scaling",
        ),
    ],
)
def test_quant_settings_that_would_do_nothing_are_refused(tiny, extra, match):
    sections = {
        "model": {"n_stacks": 2, "blocks_per_stack": 1},
        "objective": {"name": "diffusion"},
        "progressive": {"strategy": "progressive"},
        "lora": {"enabled": True},
        "quant": {"enabled": True},
    }
    for sec, values in extra.items():
        sections[sec] = {**sections[sec], **values}
    if sections["progressive"].get("new_stack_precision", "full") == "full" and not sections[
        "lora"
    ].get("trunk_adapters"):
        sections["lora"] = {"enabled": False}
    with pytest.raises(StackWiseError, match=match):
        tiny(**sections)


def test_parameter_counts_are_weights_not_packed_bytes():
    from stackwise.model.rack import count_parameters

    layer = nn.Sequential(nn.Linear(64, 32, bias=False))
    before = count_parameters(layer)
    for fmt in ("nf4", "nvfp4", "fp8"):
        q = nn.Sequential(nn.Linear(64, 32, bias=False))
        quantize_linears(q, fmt)
        assert count_parameters(q) == before == 64 * 32


def lora_params(stack: nn.Module, adapter: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in stack.named_parameters()
        if "lora_" in n and f".{adapter}." in n
    }


def base_state(stack: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in stack.state_dict().items() if "lora_" not in k}


def changed(a: dict, b: dict) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


def test_dual_lora_every_adapter_trains_and_frozen_weights_do_not(tiny):
    cfg = tiny(**QLORA)
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    pt = progressive_recipe(cfg, data, quiet=True)
    b = pt.builder
    for k in range(3):
        before = {
            id(s): (base_state(s), lora_params(s, "stack"), lora_params(s, "trunk"))
            for s in b.rack.stacks
        }
        pt.records.append(pt.train_stage(k, 3))
        new = b.new_stack
        opt_params = {id(p) for g in pt.last_trainer.optimizer.param_groups for p in g["params"]}
        trainable = [p for p in b.rack.parameters() if p.requires_grad]
        assert trainable and {id(p) for p in trainable} <= opt_params  # all in the optimizer
        assert all(b.meta[s].storage == "nf4" for s in b.rack.stacks)
        stack_adapter = lora_params(new, "stack")
        assert stack_adapter and len(lora_params(new, "trunk")) == 0
        for s in b.trunk:
            old_base, old_stack, old_trunk = before[id(s)]
            assert changed(old_base, base_state(s)) == set()  # nf4 codes and norms frozen
            # a qlora trunk trains every LoRA adapter it has: its stack adapter too
            assert changed(old_stack, lora_params(s, "stack")) == set(old_stack)
            trunk = lora_params(s, "trunk")
            # one trunk adapter per stack, rank 2, created once; B always moves, A after step 1
            assert len(trunk) == 14 and all(
                t.shape[0] == 2 for n, t in trunk.items() if "lora_A" in n
            )
            if old_trunk:  # reused from the previous stage, and trained again
                assert changed(old_trunk, trunk) == set(trunk)
            else:  # created this stage: B starts at zero, so nonzero B means it trained
                assert all(torch.count_nonzero(t) for n, t in trunk.items() if "lora_B" in n)
        assert all(torch.count_nonzero(t) for n, t in stack_adapter.items() if "lora_B" in n)


@pytest.mark.parametrize(
    ("lora", "expected"),
    [
        ({"rank": 2}, [2, 2, 2]),
        ({"rank": 2, "strategy": "progressive", "rank_pattern": "increasing"}, [2, 4, 8]),
        ({"rank": 2, "strategy": "progressive", "rank_pattern": "decreasing"}, [8, 4, 2]),
        ({"rank": 2, "strategy": "progressive", "rank_pattern": "linear"}, [2, 4, 6]),
        ({"rank": 2, "strategy": "variable", "per_stack": {1: {"rank": 5}}}, [2, 5, 2]),
    ],
)
def test_rank_each_stack_ends_up_with(tiny, lora, expected):
    cfg = tiny(
        model={"n_stacks": 3, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        train={"max_steps": 600},
        progressive={"strategy": "progressive", "steps_per_stack": 1, "new_stack_precision": "fp8"},
        lora={"enabled": True, **lora},
    )
    res = train_from_config(cfg, quiet=True)
    ranks = [s.blocks[0].attn.q_proj.lora_A["stack"].weight.shape[0] for s in res.rack.stacks]
    assert ranks == expected
    assert [rank_for(k, 3, cfg.lora)[0] for k in range(3)] == expected
    # a reload rebuilds each stack's adapter with its own rank
    _, again, _ = load_trained(res.output_dir)
    assert torch.equal(probe_logits(cfg, res.rack.eval()), probe_logits(cfg, again))


def spec_plan(model: ModelSpec) -> Plan:
    """A Plan of default specs around `model` (a causal objective, no memory)."""
    from stackwise import spec

    sections = ("data", "objective", "masking", "train", "logging", "sample", "lora", "quant")
    made = {k: getattr(spec, f"{k.capitalize()}Spec")() for k in sections}
    return Plan(model=model, progressive=ProgressiveSpec(), memory=MemorySpec(), **made)


def test_stack_files_record_the_adapter_spec_and_old_lists_still_load(tmp_path):
    """The adapter spec flows builder -> stack file -> reload; metadata written before it
    (`adapters: {name: [rank, alpha, "float32"]}`) loads to the same rack."""
    from stackwise.io.stack_files import rack_from_stacks, save_anchor_and_manifest, save_stack
    from stackwise.progressive import ProgressiveRackBuilder

    plan = spec_plan(ModelSpec(d_model=32, n_heads=2, n_stacks=1, blocks_per_stack=1))
    b = ProgressiveRackBuilder(plan.model, 50, causal=True)
    stack = b.add_stack(precision="fp8", adapter=AdapterSpec(4, 8.0, 0.1, "bf16"))
    b.ensure_trunk_adapter(stack, AdapterSpec(2, 4.0))
    with torch.no_grad():
        for n, p in stack.named_parameters():
            if "lora_B" in n:
                p.normal_()  # adapters that change the output, so a reload must rebuild them
    save_stack(tmp_path, 0, stack, b.meta[stack].as_dict())
    save_anchor_and_manifest(tmp_path, b.rack, [0])
    path = tmp_path / "stacks" / "stack_0.json"
    meta = json.loads(path.read_text())
    assert meta["adapters"] == {
        "stack": {"rank": 4, "alpha": 8.0, "dropout": 0.1, "dtype": "bf16"},
        "trunk": {"rank": 2, "alpha": 4.0, "dropout": 0.0, "dtype": "fp32"},
    }
    ids = torch.randint(0, 50, (2, 8))
    want = b.rack.eval()(ids)
    old = {"stack": [4, 8.0, "bfloat16"], "trunk": [2, 4.0, "float32"]}
    for adapters in (meta["adapters"], old):
        path.write_text(json.dumps({**meta, "adapters": adapters}))
        rack = rack_from_stacks(plan, 50, tmp_path).eval()
        q = rack.stacks[0].blocks[0].attn.q_proj
        assert q.lora_A["stack"].weight.dtype == torch.bfloat16 and q.r["stack"] == 4
        assert q.lora_A["trunk"].weight.dtype == torch.float32 and q.r["trunk"] == 2
        assert torch.equal(rack(ids), want)
    with pytest.raises(ValueError, match="not an adapter dtype"):
        add_adapter(Attn(), "x", AdapterSpec(2, 4.0, 0.0, "int8"))


# -- every precision and trunk strategy from YAML --------------------------------------------

CASES = {
    "full": {},
    "bf16": {"progressive": {"new_stack_precision": "bf16"}},
    "fp16": {"progressive": {"new_stack_precision": "half"}},
    "nf4-stacks": {"progressive": {"new_stack_precision": "nf4"}, "lora": {"enabled": True}},
    "fp8-stacks": {"progressive": {"new_stack_precision": "fp8"}, "lora": {"enabled": True}},
    "nvfp4-stacks": {"progressive": {"new_stack_precision": "nvfp4"}, "lora": {"enabled": True}},
    "qlora-stacks": {"progressive": {"new_stack_precision": "qlora"}, "lora": {"enabled": True}},
    "trunk-full": {"progressive": {"trunk_strategy": "full"}},
    "trunk-frozen-cache": {"progressive": {"cache": {"enabled": True}}},
    "trunk-qlora": {
        "progressive": {"trunk_strategy": "qlora"},
        "lora": {"enabled": True, "trunk_adapters": True},
        "quant": {"enabled": True, "double_quant": True},
    },
    **{
        f"backbone-{t}": {"quant": {"enabled": True, "type": t}}
        for t in ("nf4", "nf_fp8", "nvfp4", "fp16", "bf16")
    },
    "backbone-fp32": {  # bf16-trained stacks, stored in fp32 once frozen
        "progressive": {"new_stack_precision": "bf16"},
        "quant": {"enabled": True, "type": "fp32"},
    },
}
# how stack 0 (the trunk at the end) and stack 1 (the last new stack) end up stored
STORED = {
    "full": ("full", "full"),
    "bf16": ("bf16", "bf16"),
    "fp16": ("fp16", "fp16"),
    "nf4-stacks": ("nf4", "nf4"),
    "fp8-stacks": ("fp8", "fp8"),
    "nvfp4-stacks": ("nvfp4", "nvfp4"),
    "qlora-stacks": ("nf4", "nf4"),
    "trunk-full": ("full", "full"),
    "trunk-frozen-cache": ("full", "full"),
    "trunk-qlora": ("nf4", "full"),
    "backbone-nf4": ("nf4", "full"),
    "backbone-nf_fp8": ("fp8", "full"),
    "backbone-nvfp4": ("nvfp4", "full"),
    "backbone-fp16": ("fp16", "full"),
    "backbone-bf16": ("bf16", "full"),
    "backbone-fp32": ("full", "bf16"),
}
DTYPES = {"full": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BYTES = {
    "full": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.15,
    "nvfp4": 0.6,
    "nf4": 0.6,
}  # d=32: a row scale is 1/8 B


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_precision_and_strategy_trains_from_yaml(tiny, tmp_path, case):
    base = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        train={"max_steps": 600},
        progressive={"strategy": "progressive", "steps_per_stack": 3},
    ).model_dump(mode="json")
    for sec, values in CASES[case].items():
        for key, value in values.items():
            if isinstance(value, dict):
                base[sec][key] = {**base[sec][key], **value}
            else:
                base[sec][key] = value
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(base))
    cfg = load_config(path)
    res = train_from_config(cfg, quiet=True)
    first = res.progressive.stacks[0]
    assert first.steps == 3 and first.train_loss is not None and first.train_loss < 20
    for rec in res.progressive.stacks:
        assert torch.isfinite(torch.tensor(rec.eval["loss"]))
    metas = [
        json.loads((res.output_dir / "stacks" / f"stack_{g}.json").read_text()) for g in (0, 1)
    ]
    assert tuple(m["storage"] for m in metas) == STORED[case]
    for stack, storage in zip(res.rack.stacks, STORED[case], strict=True):
        stored, params = weight_bytes(stack)
        limit = BYTES[storage]
        if storage == "nf4" and CASES[case].get("quant", {}).get("double_quant"):
            limit = 1.2  # at d=32 the 1 KiB second-level code table per layer dominates
        assert stored / params <= limit and stored / params > BYTES[storage] / 2.2
        assert stack.blocks[0].attn_norm.weight.dtype == DTYPES.get(storage, torch.float32)
    _, again, _ = load_trained(res.output_dir)
    got, want = probe_logits(cfg, again), probe_logits(cfg, res.rack.eval())
    assert torch.equal(got, want), case


# -- 5. merging ------------------------------------------------------------------------------


def test_merge_lora_cli_fp32_base(tiny, tmp_path, capsys):
    cfg = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        progressive={"strategy": "progressive", "steps_per_stack": 3, "trunk_strategy": "qlora"},
        lora={"enabled": True, "trunk_adapters": True},
        quant={"enabled": True, "type": "fp32"},
        train={"max_steps": 600, "group_lr": {"lora": 0.01}},  # lora_lr: dropped when merged
    )
    res = train_from_config(cfg, quiet=True)
    adapted = probe_logits(cfg, res.rack.eval())
    out = tmp_path / "merged"
    assert main(["merge-lora", str(res.output_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    # both stacks: each has its own adapter (lora.enabled), the trunk one its trunk adapter too
    assert "Merged the adapters of 2 stack" in printed
    _, merged, _ = load_trained(out)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert (probe_logits(cfg, merged) - adapted).abs().max() < 1e-4
    # never overwrites
    assert main(["merge-lora", str(res.output_dir), str(out)]) == 2
    assert "never overwrites" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["nvfp4", "nf4"])
def test_merge_lora_of_quantized_bases_reports_the_error(tiny, tmp_path, capsys, fmt):
    cfg = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        train={"max_steps": 600},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": 3,
            "new_stack_precision": fmt,
            "trunk_strategy": "qlora",
        },
        lora={"enabled": True, "trunk_adapters": True},
        quant={"enabled": True, "type": fmt},
    )
    res = train_from_config(cfg, quiet=True)
    adapted = probe_logits(cfg, res.rack.eval())
    out, requant = tmp_path / "merged", tmp_path / "requant"
    assert main(["merge-lora", str(res.output_dir), str(out)]) == 0
    _, merged, _ = load_trained(out)
    assert (probe_logits(cfg, merged) - adapted).abs().max() < 1e-3  # dequantized base + deltas
    assert main(["merge-lora", str(res.output_dir), str(requant), "--requantize"]) == 0
    io = capsys.readouterr()
    assert "warning" in io.err and "requantized" in io.out
    _, small, _ = load_trained(requant)
    stored, params = weight_bytes(small.stacks)
    assert stored / params < 0.6  # stored as fmt again
    err = (probe_logits(cfg, small) - adapted).abs().max()
    assert 0 < err < adapted.abs().max()  # rounding moved it, and the report measured it
