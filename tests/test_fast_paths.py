"""The rack's fast paths compute what the plain layers compute: q/k/v and gate/up each in one
matmul over their stacked weights (under autocast to another dtype, where it costs no memory),
RoPE by a roll with a signed sine table, or in fp32 as a complex product over reordered pairs.
Each is compared with the layer-by-layer computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stackwise.config import ModelConfig
from stackwise.model import Rack
from stackwise.model.fast_paths import joint_linear, paired_rope, plain_linears
from stackwise.model.layers import Attention, SwiGLU
from stackwise.model.rope import Rotary, apply_rope, pair_halves, rope_phases, rotated_heads

V = 50


def rack(**kw) -> Rack:
    base = {"d_model": 32, "n_heads": 4, "n_stacks": 2, "blocks_per_stack": 1, "max_seq_len": 24}
    torch.manual_seed(0)
    return Rack(ModelConfig(**{**base, **kw}), V, True)


def layer_by_layer(model: nn.Module) -> list:
    """Force every projection through its own forward: a no-op hook makes a linear 'not
    plain', so the fused paths step aside. Returns the handles to remove."""
    return [
        m.register_forward_hook(lambda *_: None)
        for m in model.modules()
        if isinstance(m, nn.Linear)
    ]


def rotate_half_reference(x: torch.Tensor, head_dim: int, positions: int) -> torch.Tensor:
    """Llama's rotary embedding written out the textbook way."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def test_rope_by_roll_equals_rotate_half_bit_for_bit():
    x = torch.randn(2, 3, 10, 16)
    cos, sin = Rotary(16, 10, 10000.0)(10)
    assert torch.equal(apply_rope(x, cos, sin), rotate_half_reference(x, 16, 10))


def test_joint_linear_equals_each_linear_with_and_without_bias():
    x = torch.randn(3, 5, 8)
    for bias in (False, True):
        layers = [nn.Linear(8, n, bias=bias) for n in (4, 6, 6)]
        expected = torch.cat([layer(x) for layer in layers], dim=-1)
        assert torch.allclose(joint_linear(x, *layers), expected, atol=1e-6)


def test_wrapped_or_hooked_linears_are_not_read_directly():
    plain = nn.Linear(4, 4)
    assert plain_linears(plain, nn.Linear(4, 2))
    hooked = nn.Linear(4, 4)
    hooked.register_forward_pre_hook(lambda *_: None)  # how ZeRO-3 gathers a weight
    assert not plain_linears(plain, hooked)

    class Wrapped(nn.Linear):
        """Stands for a LoRA or quantized linear: a class other than nn.Linear."""

    assert not plain_linears(plain, Wrapped(4, 4))


def counting_joint(monkeypatch) -> list[int]:
    """Record how many layers each joint_linear call stands for."""
    import stackwise.model.layers as layers

    calls: list[int] = []
    real = layers.joint_linear
    monkeypatch.setattr(
        layers, "joint_linear", lambda x, *ls: calls.append(len(ls)) or real(x, *ls)
    )
    return calls


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 2}, {"attention_bias": True}, {"n_kv_heads": 1}])
def test_fused_rack_equals_the_layer_by_layer_rack_in_outputs_and_gradients(kw, monkeypatch):
    joint = counting_joint(monkeypatch)
    fused, plain = rack(**kw), rack(**kw)
    plain.load_state_dict(fused.state_dict())
    layer_by_layer(plain)
    ids = torch.randint(0, V, (2, 12))
    outs = []
    for model in (fused, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids)
        logits.float().square().mean().backward()
        outs.append(logits.float())
    assert joint == [3, 2, 3, 2]  # the fused rack's q/k/v and gate/up, once per block
    # bf16 products of a differently blocked GEMM: equal to bf16 rounding, not bit for bit
    assert torch.allclose(outs[0], outs[1], atol=2e-2, rtol=2e-2)
    grads = dict(plain.named_parameters())
    for name, p in fused.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, atol=2e-3, rtol=5e-2), name


def counting_rotations(monkeypatch) -> list[int]:
    """Record the head count of each rotated_heads call (q's, then k's)."""
    import stackwise.model.layers as layers

    calls: list[int] = []
    real = layers.rotated_heads
    monkeypatch.setattr(
        layers, "rotated_heads", lambda x, lin, h, ph: calls.append(h) or real(x, lin, h, ph)
    )
    return calls


def outputs_and_gradients(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    logits = model(ids)
    logits.square().mean().backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("kw", [{}, {"n_kv_heads": 2}, {"attention_bias": True}])
def test_full_precision_keeps_each_linear_and_rotates_q_and_k_as_complex_pairs(kw, monkeypatch):
    """In fp32 the stacked weights would be a second copy kept until backward: the layers run
    one by one. Queries and keys are rotated as complex pairs (their rows reordered alike),
    which gives the layer-by-layer rack's outputs within 1e-5 in fp32, and its outputs and
    gradients to rounding in fp64 (where a wrong gradient cannot hide below the tolerance)."""
    joint, rotations = counting_joint(monkeypatch), counting_rotations(monkeypatch)
    ids = torch.randint(0, V, (2, 12))
    for dtype, atol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        fast, plain = rack(**kw).to(dtype), rack(**kw).to(dtype)
        plain.load_state_dict(fast.state_dict())
        layer_by_layer(plain)
        (out, grads), (want, wanted) = (outputs_and_gradients(m, ids) for m in (fast, plain))
        torch.testing.assert_close(out, want, rtol=0, atol=atol)
        assert grads.keys() == wanted.keys() and None not in grads.values()
        for name, grad in grads.items():
            scale = wanted[name].abs().max().item() or 1.0
            torch.testing.assert_close(grad, wanted[name], rtol=0, atol=atol * scale, msg=name)
    heads = (4, kw.get("n_kv_heads", 4))
    assert joint == [] and rotations == [*heads, *heads] * 2  # two blocks, two dtypes


def test_paired_rotation_is_rotate_half_with_each_heads_pairs_side_by_side():
    torch.manual_seed(3)
    heads, hd, n = 3, 8, 10
    layer, x = nn.Linear(16, heads * hd), torch.randn(2, n, 16)
    cos, sin = Rotary(hd, n, 10000.0)(n)
    plain = apply_rope(layer(x).view(2, n, heads, hd).transpose(1, 2), cos, sin)
    paired = plain.view(2, heads, n, 2, hd // 2).transpose(-1, -2).reshape(plain.shape)
    phases = rope_phases((cos, sin), torch.float32)
    torch.testing.assert_close(rotated_heads(x, layer, heads, phases), paired)
    assert pair_halves(torch.arange(8.0), 1).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_the_paired_rotation_steps_aside_where_it_cannot_run_or_would_not_pay(monkeypatch):
    """bf16 has no complex type; autocast gives bf16 projections; inductor fuses the rotation
    itself; a hooked or wrapped linear must run its own forward (a backward hook, or a hook
    on every module, too); a KV cache keeps its keys in rotate-half order, and a cached decode
    gives the uncached rack's logits."""
    from stackwise.model.layers import KVCache

    x = torch.randn(1, 4, 8)
    plain = [nn.Linear(8, 8), nn.Linear(8, 8)]
    assert paired_rope(x, *plain)
    bf16 = nn.Linear(8, 8, dtype=torch.bfloat16)
    assert not paired_rope(x.bfloat16(), bf16, bf16)
    assert not paired_rope(x.double(), *plain)  # the weights' dtype differs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not paired_rope(x, *plain)
    replaced = nn.Linear(8, 8)
    replaced.forward = lambda t: t  # e.g. a wrapper set on the instance
    assert not paired_rope(x, plain[0], replaced)
    for hook in ("register_forward_hook", "register_full_backward_hook"):
        hooked = nn.Linear(8, 8)
        getattr(hooked, hook)(lambda *_: None)
        assert not paired_rope(x, plain[0], hooked), hook
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert not paired_rope(x, *plain)
    finally:
        handle.remove()
    assert paired_rope(x, *plain)
    rotations = counting_rotations(monkeypatch)
    model, ids = rack(), torch.randint(0, V, (1, 6))
    with torch.no_grad():
        whole = model(ids)
        cache = KVCache()
        model(ids[:, :5], cache=cache)
        assert rotations == [4, 4, 4, 4]  # the uncached forward only
        step = model(ids[:, 5:], cache=cache)
    torch.testing.assert_close(step[:, -1], whole[:, -1], rtol=0, atol=1e-5)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not paired_rope(x, *plain)


def test_sharding_turns_the_pairing_off(monkeypatch):
    """Under FSDP q and k are gathered shards: a reordered whole copy kept until backward
    would undo part of the saving, so the sharded rack rotates in rotate-half order."""
    import torch.distributed.fsdp as fsdp_module

    from stackwise.parallel import fsdp

    for name in ("device_mesh", "mixed_precision"):  # no process group: nothing is sharded
        monkeypatch.setattr(fsdp, name, lambda *a: None)
    monkeypatch.setattr(fsdp_module, "fully_shard", lambda *a, **k: None)

    class Accelerator:
        device, num_processes, is_main_process, mixed_precision = torch.device("cpu"), 2, True, "no"

    sharder = fsdp.FSDP()
    spec = {"sharding": None, "cpu_offload": False, "shard_group_size": None}
    sharder.configure(type("Spec", (), spec)())
    model, ids = rack(), torch.randint(0, V, (1, 6))
    rotations = counting_rotations(monkeypatch)
    model(ids)
    assert rotations == [4, 4, 4, 4]  # paired before sharding
    rotations.clear()
    sharder.shard(model, Accelerator())
    model(ids)
    assert rotations == []
    assert not any(m.rope_pairing for m in model.modules() if isinstance(m, Attention))


def test_a_frozen_up_projection_is_not_fused_with_its_trained_gate(monkeypatch):
    joint = counting_joint(monkeypatch)
    model = rack(frozen_up_proj=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, V, (1, 6)))
    assert joint == [3, 3]  # q/k/v fused; gate and up not (one trains, one does not)


def test_fused_attention_and_mlp_keep_the_parameter_names_checkpoints_use():
    """No layout change: a state dict saved before the fused paths loads unchanged."""
    names = set(rack().state_dict())
    block = "stacks.0.blocks.0."
    for proj in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "ffn.gate_proj", "ffn.up_proj"):
        assert f"{block}{proj}.weight" in names


def test_hooked_attention_and_swiglu_run_each_linear():
    spec = rack().cfg
    attn, ffn = Attention(spec, True), SwiGLU(spec)
    calls = []
    attn.q_proj.register_forward_hook(lambda *_: calls.append("q"))
    ffn.gate_proj.register_forward_hook(lambda *_: calls.append("gate"))
    x = torch.randn(1, 4, spec.d_model)
    cos, sin = Rotary(spec.d_model // spec.n_heads, 8, 10000.0)(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn(x, (cos, sin), None)
        ffn(x)
    assert calls == ["q", "gate"]  # hooked: each ran its own forward


def test_a_cached_decode_keeps_k_and_v_apart_from_q():
    """With a KV cache, the kept keys and values are their own tensors, not views of the
    joint projection (which would keep q's memory alive in the cache)."""
    from stackwise.model.layers import KVCache

    model, cache = rack(), KVCache()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, V, (1, 5)), cache=cache)
    for k, v in cache.layers.values():
        assert k.is_contiguous() and v.is_contiguous()
        assert k.untyped_storage().nbytes() == k.numel() * k.element_size()


@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_flop_meter_counts_plain_blocks_without_unfusing_them(monkeypatch, checkpointed):
    """The trainer's FLOP meter counts a plain block from its stack's hook: its linears keep
    no hooks of their own, so they still run fused, and the count equals the per-layer one
    (with activation checkpointing too, whose recomputation stops before the last matmul)."""
    from stackwise.train.flops import FlopMeter, linear_shape

    joint = counting_joint(monkeypatch)
    fused = rack(gradient_checkpointing=checkpointed)
    hooked = rack(gradient_checkpointing=checkpointed)
    hooked.load_state_dict(fused.state_dict())
    counts = []
    for model in (fused, hooked):
        meter = FlopMeter(model)
        if model is hooked:
            meter.detach()
            meter._whole = set()  # count layer by layer, as for a non-plain block
            for module in model.modules():
                if linear_shape(module) is not None:  # the tied head too
                    meter._handles.append(module.register_forward_hook(meter._linear))
                elif isinstance(module, Attention):
                    hook = module.register_forward_hook(meter._attention, with_kwargs=True)
                    meter._handles.append(hook)
        with meter.counting():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(torch.randint(0, V, (2, 12)))
            logits.float().sum().backward()
        counts.append(meter.total)
        meter.detach()
    assert joint[:4] == [3, 2, 3, 2]  # the first rack ran fused
    assert counts[0] == counts[1] > 0
