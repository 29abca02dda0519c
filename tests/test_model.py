"""The native rack: attention masking, GQA, RoPE, FFN options, time conditioning, checkpointing."""

from __future__ import annotations

import pytest
import torch

from stackwise.config import ModelConfig
from stackwise.model import Rack
from stackwise.model.layers import apply_rope

V = 40


def rack(causal: bool = True, num_time_steps: int | None = None, **kw) -> Rack:
    base = {"d_model": 32, "n_heads": 4, "n_stacks": 2, "blocks_per_stack": 1, "max_seq_len": 24}
    torch.manual_seed(0)
    return Rack(ModelConfig(**{**base, **kw}), V, causal, num_time_steps).eval()


def test_causal_rack_never_looks_ahead_and_bidirectional_does():
    x = torch.randint(4, V, (2, 16))
    y = x.clone()
    y[:, 10:] = torch.randint(4, V, (2, 6))
    causal, bidir = rack(True), rack(False)
    with torch.no_grad():
        assert torch.allclose(causal(x)[:, :10], causal(y)[:, :10], atol=1e-6)
        assert not torch.allclose(bidir(x)[:, :10], bidir(y)[:, :10], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_mask_hides_pad_positions(causal):
    m = rack(causal)
    x = torch.randint(4, V, (2, 12))
    mask = torch.ones_like(x)
    mask[:, 8:] = 0
    y = x.clone()
    y[:, 8:] = torch.randint(4, V, (2, 4))  # change only padded content
    with torch.no_grad():
        a, b = m(x, mask), m(y, mask)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-5)
    assert torch.isfinite(a).all()
    if not causal:  # without the mask the pads would be seen
        assert not torch.allclose(m(x)[:, :8], m(y)[:, :8], atol=1e-4)


def test_left_padding_gives_finite_outputs():
    m = rack(True)
    x = torch.randint(4, V, (1, 10))
    mask = torch.ones_like(x)
    mask[:, :3] = 0
    with torch.no_grad():
        assert torch.isfinite(m(x, mask)).all()


def test_gqa_shares_key_value_heads():
    m = rack(n_kv_heads=2)
    attn = m.stacks[0].blocks[0].attn
    assert attn.k_proj.weight.shape == (2 * 8, 32) and attn.q_proj.weight.shape == (4 * 8, 32)
    # reference: expand kv heads by hand and compare with the SDPA enable_gqa path
    x = torch.randn(1, 6, 32)
    cos, sin = m.rotary(6)
    q = apply_rope(attn.q_proj(x).view(1, 6, 4, 8).transpose(1, 2), cos, sin)
    k = apply_rope(attn.k_proj(x).view(1, 6, 2, 8).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = attn.o_proj(ref.transpose(1, 2).reshape(1, 6, 32))
    with torch.no_grad():
        assert torch.allclose(attn(x, (cos, sin), None), ref, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    m = rack()
    cos, sin = m.rotary(24)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i: int, j: int) -> float:
        qi = apply_rope(q, cos[i : i + 1], sin[i : i + 1])
        kj = apply_rope(k, cos[j : j + 1], sin[j : j + 1])
        return float((qi * kj).sum())

    assert score(5, 2) == pytest.approx(score(15, 12), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)


def test_tied_head_shares_embedding_and_untied_does_not():
    tied, untied = rack(tie_embeddings=True), rack(tie_embeddings=False)
    assert tied.lm_head is None
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == V * 32
    x = torch.randint(4, V, (1, 5))
    tied(x).sum().backward()
    assert tied.embed_tokens.weight.grad is not None


def test_frozen_up_projection_stays_fixed_while_the_rest_trains():
    m = rack(frozen_up_proj=True).train()
    up = m.stacks[0].blocks[0].ffn.up_proj.weight
    gate = m.stacks[0].blocks[0].ffn.gate_proj.weight
    before_up, before_gate = up.clone(), gate.clone()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    m(torch.randint(4, V, (2, 8))).logsumexp(-1).mean().backward()
    opt.step()
    assert not up.requires_grad and torch.equal(up, before_up)
    assert not torch.equal(gate, before_gate)
    assert abs(float(up.std()) - 32**-0.5) < 0.05  # random features, not the tiny init


@pytest.mark.parametrize(("kind", "steps"), [("sinusoidal", None), ("learned", 8)])
def test_time_conditioning_changes_outputs_and_trains(kind, steps):
    m = rack(False, num_time_steps=steps, time_conditioning=kind).train()
    x = torch.randint(4, V, (2, 8))
    a = m(x, t=torch.tensor([0.1, 0.1]))
    b = m(x, t=torch.tensor([0.9, 0.9]))
    assert not torch.allclose(a, b, atol=1e-5)
    (a.logsumexp(-1).mean() + b.logsumexp(-1).mean()).backward()
    grads = [p.grad for p in m.time_embed.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="pass t"):
        m(x)


def test_learned_time_maps_grid_points_to_their_own_row():
    m = rack(False, num_time_steps=4, time_conditioning="learned")
    t = torch.tensor([0.25, 0.5, 0.75, 1.0, 0.01])
    idx = (torch.ceil(t * 4) - 1).clamp(0, 3).long()
    assert idx.tolist() == [0, 1, 2, 3, 0]
    assert torch.equal(m.time_embed(t), m.time_embed.table.weight[idx])


def test_gradient_checkpointing_gives_the_same_gradients():
    x = torch.randint(4, V, (2, 12))
    grads = []
    for flag in (False, True):
        m = rack(gradient_checkpointing=flag).train()
        m(x).logsumexp(-1).mean().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_checkpointing_recomputes_blocks_in_backward():
    calls = {"n": 0}
    m = rack(gradient_checkpointing=True).train()
    block = m.stacks[0].blocks[0]
    block.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    m(torch.randint(4, V, (1, 6))).sum().backward()
    assert calls["n"] == 2  # forward, then recomputation during backward


def test_longer_than_max_seq_len_is_refused():
    with pytest.raises(ValueError, match="max_seq_len"):
        rack()(torch.randint(4, V, (1, 30)))


@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_kv_cache_gives_the_logits_of_the_full_forward(n_kv_heads):
    from stackwise.config import ModelConfig
    from stackwise.model.layers import KVCache

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_stacks=2, max_seq_len=24)
    rack = Rack(cfg, 50, causal=True).eval()
    ids = torch.randint(0, 50, (3, 20))
    with torch.no_grad():
        full = rack(ids)
        cache = KVCache()
        parts = [rack(ids[:, :7], cache=cache)]  # prefill, then one token at a time
        parts += [rack(ids[:, i : i + 1], cache=cache) for i in range(7, 20)]
    assert cache.length == 20
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cached_generation_equals_uncached_and_runs_one_token_per_pass(tiny):
    from stackwise.generate import generate_clm
    from stackwise.samplers import SampleStats

    cfg = tiny(model={"max_seq_len": 32}, sample={"max_new_tokens": 40, "temperature": 1.0})
    torch.manual_seed(0)
    rack = Rack(cfg.model, 60, causal=True).eval()
    prompt = torch.randint(0, 60, (2, 5))
    outs, stats = [], []
    for use_cache in (True, False):
        st = SampleStats()
        gen = torch.Generator().manual_seed(1)
        outs.append(generate_clm(rack, prompt, 40, cfg.sample, gen, None, st, use_cache))
        stats.append(st)
    # 45 tokens > max_seq_len 32: the window slides, and both paths see the same context
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == (2, 45)
    assert stats[0].forward_passes == stats[1].forward_passes == 40


def test_a_filled_kv_cache_takes_one_token_at_a_time():
    from stackwise.config import ModelConfig
    from stackwise.model.layers import KVCache

    rack = Rack(ModelConfig(d_model=16, n_heads=2, n_stacks=1, max_seq_len=16), 20, causal=True)
    cache = KVCache()
    rack(torch.randint(0, 20, (1, 4)), cache=cache)
    with pytest.raises(ValueError, match="one new token at a time"):
        rack(torch.randint(0, 20, (1, 2)), cache=cache)
