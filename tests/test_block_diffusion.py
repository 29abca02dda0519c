"""Block diffusion (objective block_diffusion): what each prediction may see, the causal LM at
blocks of one token, the block sampler's KV cache against the full pass, the rules, and runs
end to end (whole rack, grown with time as input and as depth, a QLoRA trunk)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from stackwise.cli import main
from stackwise.config.loading import InvalidConfig
from stackwise.errors import StackWiseError
from stackwise.generate import generate
from stackwise.model.rack import Rack
from stackwise.objectives import CLM, BlockDiffusion, Specials
from stackwise.objectives.base import IGNORE
from stackwise.objectives.schedules import Linear, time_for_fraction
from stackwise.pipeline import train_from_config
from stackwise.runs import load_trained
from stackwise.samplers import BlockRemask, BlockSampler, MaskedSampler, MaskedSampling
from stackwise.spec import ModelSpec

V, MASK, PAD = 40, 39, 0
SPECIALS = Specials(vocab_size=V, pad_id=PAD, mask_id=MASK)
BD = {"objective": {"name": "block_diffusion", "block_size": 4}}


def rack_of(block: int | None, seed: int = 0, shift: bool = True, **model) -> Rack:
    torch.manual_seed(seed)
    spec = ModelSpec(
        vocab_size=V, d_model=32, n_heads=4, n_stacks=2, blocks_per_stack=1, max_seq_len=32,
        diffusion_block=block, diffusion_shift=shift, **model,
    )  # fmt: skip
    return Rack(spec, V, causal=block is None).eval()


def ids_of(rows: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, MASK, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("padded", [False, True])
def test_blocks_of_one_token_are_the_causal_lm_on_the_same_weights(padded):
    """t = 1 (a one-step grid) masks every token but the first, with NELBO weight 1."""
    clm_rack, bd_rack = rack_of(None), rack_of(1)
    bd_rack.load_state_dict(clm_rack.state_dict())
    ids = ids_of(3, 16)
    batch = {"input_ids": ids}
    if padded:
        keep = torch.ones_like(ids)
        keep[1, 10:], keep[2, 5:] = 0, 0
        batch = {"input_ids": ids.masked_fill(keep == 0, PAD), "attention_mask": keep}
    gen = torch.Generator().manual_seed(0)
    clm = CLM(SPECIALS).prepare(batch, gen)
    bd = BlockDiffusion(SPECIALS, Linear(), 1, num_time_steps=1).prepare(batch, gen)
    assert torch.equal(bd.targets, clm.targets)
    clm_loss = CLM(SPECIALS).loss(clm_rack(clm.inputs, clm.attention_mask), clm)
    bd_loss = BlockDiffusion(SPECIALS, Linear(), 1).loss(
        bd_rack(bd.inputs, bd.attention_mask, bd.t), bd
    )
    assert abs(clm_loss.item() - bd_loss.item()) < 1e-5
    assert bd_loss.item() > 1.0  # an untrained rack: a real loss, not a trivial zero


@torch.no_grad()
def test_each_prediction_sees_the_clean_blocks_before_it_and_nothing_after():
    """Position j predicts token j + 1 of block b: it must not see the clean copy of block b or
    anything later, and must see the clean blocks before b."""
    rack = rack_of(4)
    ids = ids_of(2, 16)
    noised = ids.clone()
    noised[:, 5::2] = MASK
    base = rack(torch.cat([noised, ids], 1), None, None)
    for b in range(1, 4):
        later = torch.cat([noised, ids], 1)
        later[:, 16 + 4 * b :] = ids_of(2, 16 - 4 * b, seed=b + 7)  # clean copy from block b on
        later[:, 4 * (b + 1) : 16] = MASK  # the noised copy after block b
        out = rack(later, None, None)
        predicts_b = slice(4 * b - 1, 4 * b + 3)
        torch.testing.assert_close(out[:, predicts_b], base[:, predicts_b], atol=0, rtol=0)
        earlier = torch.cat([noised, ids], 1)
        earlier[:, 16 + 4 * (b - 1)] = (ids[:, 4 * (b - 1)] % 30) + 1
        changed = (rack(earlier, None, None) - base)[:, 4 * b : 4 * b + 3].abs().amax()
        assert float(changed) > 1e-4


@torch.no_grad()
def test_without_the_shift_each_position_predicts_its_own_token_from_its_block():
    """BD3-LM's layout: a noised position of block b sees its block (masked or revealed) and
    the clean blocks before b, never the clean copy of b or anything later."""
    rack = rack_of(4, shift=False)
    ids = ids_of(2, 16)
    noised = ids.clone()
    noised[:, ::3] = MASK
    base = rack(torch.cat([noised, ids], 1), None, None)
    for b in range(4):
        later = torch.cat([noised, ids], 1)
        later[:, 16 + 4 * b :] = ids_of(2, 16 - 4 * b, seed=b + 7)
        later[:, 4 * (b + 1) : 16] = MASK
        own = slice(4 * b, 4 * b + 4)
        torch.testing.assert_close(rack(later, None, None)[:, own], base[:, own], atol=0, rtol=0)
    revealed = torch.cat([noised, ids], 1)
    revealed[:, 5] = (ids[:, 5] % 30) + 1  # a revealed token of block 1 reaches block 1 only
    moved = (rack(revealed, None, None) - base).abs().amax(dim=(0, 2))
    assert float(moved[4:8].min()) > 1e-5 and float(moved[:4].max()) == 0.0


def test_without_the_shift_every_token_is_scored_and_an_empty_prompt_samples():
    ids = ids_of(64, 12)
    prep = BlockDiffusion(SPECIALS, Linear(), 4, shift=False).prepare(
        {"input_ids": ids}, torch.Generator().manual_seed(0)
    )
    masked = prep.inputs[:, :12] == MASK
    assert bool(masked[:, 0].any())  # the first token is masked too: nothing is given
    assert torch.equal(prep.targets != IGNORE, masked)
    assert torch.equal(prep.targets[masked], ids[masked]) and int(prep.normalizer) == 64 * 12
    rack = rack_of(4, shift=False)
    run = MaskedSampler(
        rack, MaskedSampling(sampler="block", steps=4), MASK, [MASK], torch.Generator()
    )
    with torch.no_grad():
        out = run.run(ids[:2, :0], 8)
    assert out.shape == (2, 8) and not bool((out == MASK).any())


def test_the_objective_masks_after_the_first_token_and_never_the_prompt():
    ids = ids_of(64, 12)
    labels = ids.clone()
    labels[:, :4] = IGNORE  # instruction rows: a 4-token prompt
    batch = {"input_ids": ids, "labels": labels}
    prep = BlockDiffusion(SPECIALS, Linear(), 4).prepare(batch, torch.Generator().manual_seed(0))
    noised, clean = prep.inputs[:, :12], prep.inputs[:, 12:]
    masked = noised == MASK
    assert torch.equal(clean, ids) and not bool(masked[:, :4].any()) and bool(masked.any())
    scored = prep.targets != IGNORE
    assert torch.equal(scored[:, :-1], masked[:, 1:]) and not bool(scored[:, -1].any())
    assert torch.equal(prep.targets[scored], ids[:, 1:][masked[:, 1:]])
    assert int(prep.normalizer) == 64 * 8  # the replies' tokens, masked or not
    assert prep.bounded is not None and int(prep.bounded.sum()) == 64 * 8


def routed(rack: Rack) -> Rack:
    rack.set_depth_routing([(0, 0.5, 1.0), (1, 0.0, 0.5)])
    return rack


@pytest.mark.parametrize("kind", ["plain", "time input", "time as depth", "own position"])
def test_the_sampler_scores_a_block_against_its_cache_as_the_full_pass_does(kind):
    time = "sinusoidal" if kind == "time input" else "none"
    rack = rack_of(4, shift=kind != "own position", time_conditioning=time)
    rack = routed(rack) if kind == "time as depth" else rack
    x = ids_of(2, 16)
    x[0, 9:12] = MASK  # row 0 at t = 0.75, row 1 at t = 0.25: two depths when routed
    x[1, 11] = MASK
    run = MaskedSampler(rack, MaskedSampling(sampler="block"), MASK, [], torch.Generator())
    sampler = BlockSampler(run)
    sampler.reset()
    with torch.no_grad():
        for b in range(2):
            sampler.finish(x[:, 4 * b : 4 * b + 4])
        sampler.start, sampler.end = 8, 12
        cached = sampler.logits(x)
        t = time_for_fraction(Linear(), (x[:, 8:12] == MASK).float().mean(1))
        noised = x.clone()
        full = rack(torch.cat([noised, x], 1), None, t if rack.uses_time else None).float()
    same = full[:, 8:12] if kind == "own position" else full[:, 7:11]
    assert cached.shape == same.shape  # the block alone: one block's compute a step
    torch.testing.assert_close(cached, same, atol=1e-5, rtol=0)
    assert all(c.length == 8 for c in sampler.caches.values())  # scoring never extends them
    assert len(sampler.caches) == (2 if kind == "time as depth" else 1)


def test_the_block_sampler_writes_blocks_left_to_right_from_the_prompt():
    rack = rack_of(4)
    settings = MaskedSampling(sampler="block", steps=6)
    run = MaskedSampler(rack, settings, MASK, [MASK, PAD], torch.Generator().manual_seed(0))
    prompt = ids_of(2, 5)
    seen: list[torch.Tensor] = []
    with torch.no_grad():
        out = run.run(prompt, 11, on_block=lambda ids: seen.append(ids.clone()))
    assert [s.shape[1] for s in seen] == [8, 12, 16]  # blocks on the rack's own grid
    assert all(not bool((s == MASK).any()) for s in seen)
    assert torch.equal(out[:, :5], prompt) and not bool((out == MASK).any())
    # 6 steps over 3 blocks (2 each) and 3 clean blocks cached: the prompt's first, then two
    assert run.stats.forward_passes == 6 + 3


def test_block_remask_reveals_each_blocks_surest_position_first(monkeypatch):
    """low_confidence ranking at temperature 0 with one step per position: each step reveals
    exactly one position of the block, the one whose likeliest token is the surest."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    scored = BlockRemask.logits

    def recording(self, x):
        out = scored(self, x)
        seen.append((x[:, self.start : self.end].clone(), out.softmax(-1).amax(-1)))
        return out

    monkeypatch.setattr(BlockRemask, "logits", recording)
    settings = MaskedSampling(
        sampler="block_remask", remasking="low_confidence", steps=12, temperature=0.0
    )
    run = MaskedSampler(rack_of(4), settings, MASK, [MASK, PAD], torch.Generator())
    with torch.no_grad():
        out = run.run(ids_of(1, 4), 12)
    assert len(seen) == 12  # 3 blocks x 4 steps
    for i, (before, sure) in enumerate(seen):
        after = seen[i + 1][0] if i % 4 != 3 else out[:, 4 * (i // 4 + 1) : 4 * (i // 4 + 2)]
        revealed = (before == MASK) & (after != MASK)
        assert int(revealed.sum()) == 1
        surest = sure.masked_fill(before != MASK, -1.0).argmax()
        assert bool(revealed[0, surest])


@pytest.mark.parametrize(
    "sections, said",
    [
        ({"objective": {"name": "block_diffusion"}}, "needs objective.block_size"),
        ({"objective": {"name": "diffusion", "block_size": 4}}, "only applies to objective"),
        ({"objective": {"name": "clm", "block_shift": False}}, "block_shift only applies"),
        ({**BD, "sample": {"sampler": "ancestral"}}, "use sampler block"),
        ({"objective": {"name": "diffusion"}, "sample": {"sampler": "block"}}, "block_diffusion"),
        ({**BD, "sample": {"block_length": 8}}, "objective.block_size long"),
        ({**BD, "sample": {"remasking": "margin"}}, "block_remask for block diffusion"),
        ({**BD, "sample": {"remask_budget": 0.1}}, "a block_diffusion rack cannot use"),
        ({"objective": {**BD["objective"], "block_size": 64}}, "exceeds data.seq_len"),
        ({"objective": {**BD["objective"], "attention": "causal"}}, "sets its own attention"),
        (
            {
                **BD,
                "model": {"n_stacks": 2},
                "progressive": {
                    "strategy": "progressive",
                    "time_interpretation": "depth",
                    "depth_order": "high_to_low",
                },
            },
            "denoising chain",
        ),
    ],
)
def test_settings_block_diffusion_cannot_honour_are_refused(tiny, sections, said):
    with pytest.raises(InvalidConfig, match=said):
        tiny(**sections)


def test_a_block_diffusion_run_trains_evaluates_and_samples(tiny, tmp_path, capsys):
    cfg = tiny(**BD, train={"max_steps": 30, "lr": 3e-3, "eval_batches": 4})
    res = train_from_config(cfg, quiet=True)
    assert res.state is not None
    first, last = res.state.history[0], res.state.history[-1]
    assert last["bpc"] < first["bpc"] and "nelbo" in last
    plan, rack, tok = load_trained(res.output_dir)
    assert rack.block_size == 4
    samples = generate(plan, rack, tok, n=2, prompt="the", max_new_tokens=12)
    assert all(text.startswith("the") for text in samples.texts)
    args = ["eval", "--checkpoint", str(res.output_dir), "--samples", "1"]
    assert main([*args, "--t-points", "4", "--mc-num", "2", "--max-blocks", "4"]) == 0
    report = json.loads((res.output_dir / "eval.json").read_text())
    assert report["likelihood"]["bpc"] > 0 and "NELBO" in report["likelihood"]["kind"]
    assert "bits/char" in capsys.readouterr().out
    gen = ["generate", "--checkpoint", str(res.output_dir), "--max-new-tokens", "8"]
    ranked = ["--sampler", "block_remask", "--remasking", "margin"]
    assert main([*gen, "--prompt", "the", *ranked]) == 0
    assert capsys.readouterr().out.strip()
    assert main([*gen, "--sampler", "ancestral"]) == 2  # scores the whole sequence: refused
    assert "use sampler block" in capsys.readouterr().err


@pytest.mark.parametrize(
    "prog, extra",
    [
        ({"time_interpretation": "input", "cache": {"enabled": True}}, {}),
        ({"time_interpretation": "depth"}, {}),
        (
            {"trunk_strategy": "qlora"},
            {"lora": {"enabled": True, "trunk_adapters": True}, "quant": {"enabled": True}},
        ),
    ],
    ids=["time input, cached trunk", "time as depth", "qlora trunk"],
)
def test_block_diffusion_grows_stack_by_stack(tiny, prog, extra):
    model = {"n_stacks": 2, "blocks_per_stack": 1}
    if prog.get("time_interpretation") == "input":
        model["time_conditioning"] = "sinusoidal"
    cfg = tiny(
        **BD,
        model=model,
        train={"max_steps": 600},
        progressive={"strategy": "progressive", "steps_per_stack": 3, **prog},
        **extra,
    )
    res = train_from_config(cfg, quiet=True)
    assert len(res.rack.stacks) == 2 and res.rack.block_size == 4
    assert [r.steps for r in res.progressive.stacks] == [3, 3]  # each stage trained
    final = res.progressive.final_eval
    # below a uniform guess over the 300-token vocabulary: the grown rack learned
    assert final["nelbo"] < math.log(300) - 0.2 and final["bpc"] > 0
    plan, rack, tok = load_trained(res.output_dir)
    assert (rack.depth_ranges is not None) == (prog.get("time_interpretation") == "depth")
    got = generate(plan, rack, tok, n=2, max_new_tokens=8)
    assert got.ids.shape[1] == got.prompt_len + 8 and not bool((got.ids == tok.mask_token_id).any())


def test_a_plan_gives_the_rack_its_block_layout_and_a_grown_builder_must_match_it(tiny):
    from stackwise.plan import compile_plan
    from stackwise.progressive import ProgressiveRackBuilder
    from stackwise.progressive.seed_builder import check_fit

    plan = compile_plan(tiny(**BD, model={"n_stacks": 2, "blocks_per_stack": 1}))
    assert (plan.model.diffusion_block, plan.model.diffusion_shift) == (4, True)
    assert not plan.objective.causal
    plan = replace(plan, model=replace(plan.model, vocab_size=50))
    builder = ProgressiveRackBuilder(replace(plan.model, diffusion_block=None), 50, causal=False)
    builder.add_stack()  # a plain bidirectional stack: its rack would leak the clean copy
    with pytest.raises(StackWiseError, match="block-diffusion layout"):
        check_fit(builder, plan)


def test_a_stack_with_its_own_block_layout_is_refused(tiny):
    stacks = {1: {"objective": {**BD["objective"], "block_shift": False}}}
    with pytest.raises(InvalidConfig, match="block_shift"):
        tiny(
            **BD,
            model={"n_stacks": 2},
            progressive={"strategy": "progressive", "stacks": stacks},
        )


@torch.no_grad()
def test_the_eval_nelbo_of_blocks_of_one_at_full_noise_is_the_clm_exact_nll():
    """stackwise eval's estimator (masked_nll_sums) on a block-1 rack at t = 1 equals the exact
    NLL of a causal rack with the same weights, padded rows included."""
    from stackwise.evaluate.likelihood import causal_nll_sums, masked_nll_sums

    clm_rack, bd_rack = rack_of(None), rack_of(1)
    bd_rack.load_state_dict(clm_rack.state_dict())
    ids = ids_of(3, 16)
    scorable = torch.ones_like(ids, dtype=torch.bool)
    scorable[2, 9:] = False
    scorable[:, 0] = False  # the first token is given, as the clm's exact NLL has it
    bound = masked_nll_sums(bd_rack, ids, scorable, Linear(), torch.tensor([1.0]), MASK, 0)
    exact = causal_nll_sums(clm_rack, ids, scorable)
    torch.testing.assert_close(bound, exact, atol=1e-5, rtol=0)


def test_bits_per_character_count_the_bounded_tokens_only():
    from stackwise.train.evaluation import text_bytes

    ids = ids_of(4, 12)
    prep = BlockDiffusion(SPECIALS, Linear(), 4).prepare(
        {"input_ids": ids}, torch.Generator().manual_seed(0)
    )
    table = torch.arange(V, dtype=torch.float32) % 3 + 1  # 1-3 bytes a token
    got = text_bytes(table, {"input_ids": ids}, prep, PAD)
    assert got["bytes_all"] == float(table[ids[:, 1:]].sum())  # every token but the first
