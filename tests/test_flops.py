"""Training FLOPs: the meter against a hand count and against torch's own FLOP counter.

torch.utils.flop_counter counts every matrix product autograd really runs (it does not know
the CPU attention kernel), so it checks the meter's linear part exactly: which backward
products a frozen trunk, a trained one, a LoRA-adapted one skip or run. The hand counts check
the whole, attention included.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import stackwise
from stackwise.cli.common import run_summary
from stackwise.io.trained import training_compute
from stackwise.model.compiled import compile_blocks
from stackwise.progressive import ProgressiveRackBuilder, summary_table
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.stage import StageModel
from stackwise.spec import AdapterSpec, ModelSpec
from stackwise.train.flops import FlopMeter
from stackwise.units import format_flops

D, F, H, V, B, T = 32, 64, 4, 50, 3, 16  # width, FFN width, heads, vocab, batch, length


def spec(blocks: int = 1) -> ModelSpec:
    return ModelSpec(
        vocab_size=V, d_model=D, n_heads=H, n_stacks=2, blocks_per_stack=blocks, ffn_hidden=F
    )


def block_linears() -> int:
    """Multiply-adds per token of one block's linears: q, k, v, o, then gate, up, down."""
    return 4 * D * D + 3 * D * F


def attention(n_blocks: int) -> int:
    """Forward FLOPs of the attention cores: scores and weighted sum, per head, whole T x T."""
    return 4 * B * T * T * D * n_blocks


def grown(n: int = 2, blocks: int = 1) -> ProgressiveRackBuilder:
    b = ProgressiveRackBuilder(spec(blocks), V, causal=True)
    for _ in range(n):
        b.append_stack()
    return b


def step(model: torch.nn.Module, meter: FlopMeter, **kw: torch.Tensor) -> tuple[float, int]:
    """One forward and backward; (the meter's count, torch's count of the same step)."""
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    before = meter.total
    with meter.counting(), FlopCounterMode(display=False) as reference:
        model(ids, **kw).float().pow(2).mean().backward()
    return meter.total - before, reference.get_total_flops()


def test_end_to_end_step_matches_the_hand_count() -> None:
    """Everything trains: each linear and attention core costs forward + twice that back."""
    rack = grown().rack
    meter = FlopMeter(rack)
    counted, reference = step(rack, meter)
    forward = 2 * B * T * (2 * block_linears() + D * V) + attention(2)
    assert counted == 3 * forward
    assert reference == 3 * (forward - attention(2))  # torch's counter skips CPU attention


def test_a_frozen_trunk_costs_its_forward_only() -> None:
    b = grown()
    trunk, new = b.rack.stacks
    for p in [*trunk.parameters(), *b.rack.embed_tokens.parameters()]:
        p.requires_grad_(False)  # head tied to the embeddings: it passes gradients on only
    model = StageModel(b.rack, new)
    meter = FlopMeter(model)
    counted, reference = step(model, meter)
    tokens = B * T
    trunk_cost = 2 * tokens * block_linears() + attention(1)
    # the new stack trains whole: even its first q, k, v pass a gradient back, to the
    # weight of the norm before them
    new_cost = 3 * (2 * tokens * block_linears() + attention(1))
    head_cost = 2 * (2 * tokens * D * V)  # forward, and the input's gradient
    assert counted == trunk_cost + new_cost + head_cost
    assert reference == counted - 4 * attention(1)  # trunk forward, new stack's three


def test_a_cache_hit_runs_no_trunk() -> None:
    b = grown(blocks=2)
    trunk, new = b.rack.stacks
    for p in [*trunk.parameters(), *b.rack.embed_tokens.parameters()]:
        p.requires_grad_(False)
    cache = ActivationCache(B, T, D)
    model = StageModel(b.rack, new, cache)
    meter = FlopMeter(model)
    keys = torch.arange(B)
    miss, _ = step(model, meter, cache_key=keys)
    hit, _ = step(model, meter, cache_key=keys)
    trunk_forward = 2 * B * T * 2 * block_linears() + attention(2)
    assert miss - hit == trunk_forward
    assert cache.trunk_calls == 1


def test_lora_trunk_counts_the_adapters_and_the_frozen_base() -> None:
    """A trunk adapted by LoRA: its base weights get no gradient but pass one on, its adapters
    cost their own small products three times over."""
    b = grown()
    trunk, new = b.rack.stacks
    rank = 4
    b.add_adapter(trunk, "trunk", AdapterSpec(rank, 8.0))
    b.freeze_all_but_qlora([0])
    for p in b.rack.embed_tokens.parameters():
        p.requires_grad_(False)
    model = StageModel(b.rack, new)
    meter = FlopMeter(model)
    counted, reference = step(model, meter)
    tokens = B * T
    per_token_lora = sum(rank * (i + o) for i, o in [(D, D)] * 4 + [(D, F), (D, F), (F, D)])
    lora = 3 * 2 * tokens * per_token_lora - 2 * tokens * rank * 3 * D  # A of q,k,v: no input grad
    base = 2 * 2 * tokens * block_linears() - 2 * tokens * 3 * D * D  # no input grad for q, k, v
    new_stack = 3 * 2 * tokens * block_linears()
    head = 2 * 2 * tokens * D * V
    assert counted == lora + base + new_stack + head + 3 * attention(2)
    assert reference == counted - 3 * attention(2)


def test_compiled_blocks_count_as_eager_ones() -> None:
    """train.compile hides a block's layers from hooks; its stack counts them by the same
    rules, so the count is the eager one, trunk frozen or not."""
    b = grown()
    meter = FlopMeter(b.rack)
    eager_all, _ = step(b.rack, meter)
    for p in b.rack.stacks[0].parameters():
        p.requires_grad_(False)
    eager_frozen, _ = step(b.rack, meter)
    compile_blocks(b.rack)
    try:
        assert step(b.rack, meter)[0] == eager_frozen
        for p in b.rack.stacks[0].parameters():
            p.requires_grad_(True)
        assert step(b.rack, meter)[0] == eager_all
    finally:
        compile_blocks(b.rack, on=False)
        torch._dynamo.reset()  # other tests count the graphs they compile


def test_a_checkpointed_block_costs_its_forward_again() -> None:
    b = grown()
    meter = FlopMeter(b.rack)
    plain, _ = step(b.rack, meter)
    for stack in b.rack.stacks:
        stack.gradient_checkpointing = True
    again, _ = step(b.rack, meter)
    block_forward = 2 * B * T * block_linears() + attention(1)
    # each block's forward runs again, as far as the backward pass needs it (no backward twice)
    assert plain < again <= plain + 2 * block_forward


def test_evaluation_is_not_training_compute() -> None:
    rack = grown().rack
    meter = FlopMeter(rack)
    with torch.no_grad():
        rack(torch.zeros(B, T, dtype=torch.long))
    assert meter.total == 0
    meter.detach()
    with meter.counting():
        rack(torch.zeros(B, T, dtype=torch.long))
    assert meter.total == 0  # detached: nothing hooked


def test_a_run_logs_its_flops_everywhere(tiny) -> None:
    """metrics.jsonl (train and eval rows), the checkpoint's state and the run summary."""
    cfg = tiny(train={"max_steps": 4, "eval_every": 2, "batch_size": 2}, logging={"log_every": 1})
    res = stackwise.train_from_config(cfg, quiet=True)
    rows = [json.loads(x) for x in (res.output_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    flops = [r["train/flops"] for r in train]
    assert flops[0] > 0
    assert flops == pytest.approx([flops[0] * k for k in range(1, 5)])  # same work every step
    assert [r["train/flops"] for r in rows if "val/loss" in r][-1] == flops[-1]
    spent = training_compute(res.output_dir)  # what eval.json reports as "training"
    assert spent == {"flops": flops[-1], "tokens": train[-1]["train/tokens"]}
    assert res.compute() == (flops[-1], train[-1]["train/tokens"])
    assert f"compute: {format_flops(flops[-1])} training FLOPs" in run_summary(res, 1.0)


def test_format_flops() -> None:
    assert format_flops(1.234e12) == "1.23T"
    assert format_flops(5e5) == "500k"
    assert format_flops(12.0) == "12"


def cached_run(tiny, out, steps_per_stack: int, **train):
    """A clm rack of 3 one-block stacks grown on a frozen, cached trunk, 16 samples."""
    return tiny(
        model={"n_stacks": 3, "blocks_per_stack": 1},
        objective={"name": "clm"},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": steps_per_stack,
            "cache": {"enabled": True},
        },
        train={"output_dir": str(out), "batch_size": 8, "max_steps": 600, **train},
        data={"num_samples": 16},
        logging={"log_every": 1},
    )


def one_stack_forward(res) -> tuple[int, int]:
    """(sequence length, forward FLOPs per token of one block-stack) of a finished run."""
    m, seq = res.config.model, res.config.data.seq_len
    return seq, 2 * (4 * m.d_model**2 + 3 * m.d_model * m.ffn_width) + 4 * seq * m.d_model


def test_a_grown_rack_counts_every_stage_and_the_cache_carry(tiny, tmp_path) -> None:
    """Stage FLOPs add up over the run; a stage reading carried cache entries pays their one
    stack forward each, and no trunk."""
    cfg = cached_run(tiny, tmp_path / "run", steps_per_stack=8, eval_every=4)
    res = stackwise.train_from_config(cfg, quiet=True)
    stacks = res.progressive.stacks
    seq, per_token = one_stack_forward(res)
    assert stacks[2].cache["carried"] == 16 and stacks[2].cache["trunk_forwards"] == 0
    assert stacks[2].cache["carry_flops"] == 16 * seq * per_token
    assert res.compute()[0] == sum(s.flops for s in stacks) > 0
    table = summary_table(res.progressive).splitlines()
    assert [line.split()[4] for line in table[2:5]] == [format_flops(s.flops) for s in stacks]
    assert f"run total: {format_flops(res.compute()[0])} training FLOPs" in table[5]
    before = 0.0
    for index, stack in enumerate(stacks):
        rows = [
            json.loads(x)
            for x in (res.output_dir / f"stack_{index}" / "metrics.jsonl").read_text().splitlines()
        ]
        spent = [r["train/flops"] for r in rows if "train/loss" in r]
        assert spent[-1] == pytest.approx(before + stack.flops)  # the whole run's, so far
        assert rows[-1]["train/run_tokens"] == sum(s.tokens for s in stacks[: index + 1])
        before += stack.flops
    # all hits in the last stage: every step costs the same, less than stage 1's misses
    last = [r["train/flops"] for r in rows if "train/loss" in r]
    steps = [b - a for a, b in itertools.pairwise(last)]
    assert max(steps) == pytest.approx(min(steps))
    assert steps[0] < (stacks[1].flops / stacks[1].steps)


def test_a_hugging_face_model_is_counted_attention_included() -> None:
    """HF attention modules return (output, weights): their backward is counted all the same."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=F,
        num_hidden_layers=2,
        num_attention_heads=H,
        num_key_value_heads=H,
        max_position_embeddings=T,
    )
    model = LlamaForCausalLM(config)
    meter = FlopMeter(model)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    with meter.counting():
        model(ids).logits.float().pow(2).mean().backward()
    forward = 2 * B * T * (2 * block_linears() + D * V) + attention(2)
    assert meter.forward == forward
    assert meter.total == 3 * forward


def test_a_resumed_cached_run_counts_what_the_uninterrupted_one_does(tiny, tmp_path) -> None:
    """The cache carried into a stage is that stage's own cost, kept by its checkpoints. A run
    resumed inside the stage starts with an empty cache: it pays for each trunk forward its
    misses recompute, and for nothing else."""
    from test_checkpoints import crash_then_resume

    def cfg(name, **train):
        return cached_run(tiny, tmp_path / name, steps_per_stack=4, save_steps=2, **train)

    full = stackwise.train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, 2, 2)
    a, b = full.progressive.stacks, resumed.progressive.stacks
    assert a[2].cache["carry_flops"] > 0 and [s.flops for s in a[:2]] == [s.flops for s in b[:2]]
    seq, per_token = one_stack_forward(full)
    recomputed = b[2].cache["misses"] - a[2].cache["misses"]
    assert recomputed > 0
    assert b[2].flops - a[2].flops == recomputed * seq * 2 * per_token  # a two-stack trunk
