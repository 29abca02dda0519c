"""Time as depth grown high-noise-to-low: the stacks form one denoising chain, and the
single-pass sampler runs the whole rack once to sample from full noise."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from stackwise.config import from_dict
from stackwise.errors import StackWiseError
from stackwise.generate import generate
from stackwise.model.chain import DenoisingChain, nested_inputs
from stackwise.objectives.schedules import Linear
from stackwise.pipeline import train_from_config
from stackwise.progressive import depth_range
from stackwise.runs import load_trained

CHAIN = {
    "strategy": "progressive",
    "time_interpretation": "depth",
    "depth_order": "high_to_low",
}


def chain_config(tiny, **prog):
    return tiny(
        model={"n_stacks": 3, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        progressive={**CHAIN, "steps_per_stack": 40, **prog},
        train={"max_steps": 600, "eval_batches": 8},
    )


def test_high_to_low_mirrors_the_mapping(tiny):
    cfg = chain_config(tiny).progressive
    assert [depth_range(g, 4, cfg) for g in range(4)] == [
        (0.75, 1.0),
        (0.5, 0.75),
        (0.25, 0.5),
        (0.0, 0.25),
    ]


def test_nested_inputs_follow_the_forward_process():
    """Each higher level masks a superset, at the rate the schedule says, and only revealed
    tokens are masked further; the draws are a function of the input (deterministic)."""
    chain = DenoisingChain(mask_id=0, mask_fraction=Linear().mask_fraction)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(1, 50, (64, 256), generator=gen)
    x[:, ::5] = 0  # 20% masked already: t = 0.2
    t = torch.full((64,), 0.2)
    levels = [1.0, 0.8, 0.5]
    out = nested_inputs(chain, x, t, levels)
    assert torch.equal(out[-1], x)
    masked = [(o == 0) for o in out]
    for hi, lo in itertools.pairwise(masked):
        assert bool((lo <= hi).all())  # nested: a token masked at the lower level stays masked
    assert bool(masked[0].all())  # t = 1: everything is masked
    for level, m in zip(levels[1:], masked[1:], strict=False):
        assert abs(m.float().mean().item() - level) < 0.02
    again = nested_inputs(chain, x, t, levels)
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))


def test_chain_forward_runs_each_stack_on_its_own_level(tiny):
    """At noise t in stack g's range the rack is the chain 0..g: stack i reads the previous
    hidden state, rescaled to the embeddings' RMS, plus the embeddings of level i's input."""
    cfg = chain_config(tiny)
    from stackwise.data.pack import build_data
    from stackwise.pipeline import progressive_recipe, resolve_vocab

    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    for _ in range(3):
        tr.builder.add_stack()
    rack, chain = tr.builder.rack, tr.chain()
    assert chain is not None
    rack.set_depth_routing(tr.growing.depth_ranges(), chain)
    rack.eval()
    x = torch.randint(4, cfg.model.vocab_size, (2, 16))
    x[:, :6] = chain.mask_id
    t = torch.tensor([0.3, 0.3])  # stack 2's range (0, 1/3]
    with torch.no_grad():
        got = rack(x, t=t)
        levels = nested_inputs(chain, x, t, [1.0, 2 / 3])
        h = rack.embed(levels[0])
        table_rms = rack.embed_tokens.weight.pow(2).mean().sqrt()
        for i in range(3):
            if i:
                unit = h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
                h = unit * table_rms + rack.embed_tokens(levels[i])
            h = rack.run_stacks(h, None, [rack.stacks[i]])
        want = rack.logits(h)
    assert torch.allclose(got, want, atol=1e-5)
    # the revealed tokens are not drowned by a large hidden state: a huge carry is rescaled
    loud = rack.chain_input(1000.0 * torch.randn(2, 16, cfg.model.d_model), x)
    carry = loud - rack.embed_tokens(x)
    assert torch.allclose(carry.pow(2).mean(-1).sqrt(), table_rms.expand(2, 16), rtol=1e-3)
    assert bool((levels[0] == chain.mask_id).all())


def test_a_chain_trains_samples_in_one_pass_and_scores_routed(tiny):
    res = train_from_config(chain_config(tiny), quiet=True)
    f = res.progressive.final_eval
    assert f["nelbo"] <= f["whole_rack_nelbo"] + 1e-6, f  # held-back data
    _, rack, tok = load_trained(res.output_dir)
    assert rack.chain is not None and [r[2] for r in rack.depth_ranges] == pytest.approx(
        [1.0, 2 / 3, 1 / 3]
    )
    calls = []
    for stack in rack.stacks:
        stack.register_forward_hook(lambda *a: calls.append(1))
    got = generate(res.config, rack, tok, n=3, sampler="single_pass", steps=32)
    assert got.stats.forward_passes == 1 and len(calls) == 3  # each stack ran once
    assert got.stats.steps == 3
    mask_id = tok.convert_tokens_to_ids(tok.mask_token)
    assert not bool((got.ids == mask_id).any())
    ranked = generate(
        res.config, rack, tok, n=3, sampler="single_pass", steps=32, remasking="low_confidence"
    )
    assert ranked.stats.forward_passes == 1 and not bool((ranked.ids == mask_id).any())
    # a chain grown by the earlier formula (no chain_input marker) is refused, not misread
    meta_path = res.output_dir / "stacks" / "stack_1.json"
    meta = json.loads(meta_path.read_text())
    assert meta["chain_input"] == 2
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "chain_input"}))
    with pytest.raises(StackWiseError, match="earlier StackWise"):
        load_trained(res.output_dir)


@pytest.mark.parametrize(
    ("prog", "sample", "needle"),
    [
        ({"strategy": "progressive", "depth_order": "high_to_low"}, {}, "needs time_interp"),
        ({**CHAIN, "building_mode": "prepend"}, {}, "building_mode: append"),
        ({**CHAIN, "mode": "fused", "joint_tuning_steps": 2}, {}, "no joint tuning"),
        (
            {**CHAIN, "depth_mapping": "custom", "depth_time_table": [[0, 0.5], [0.5, 1]]},
            {},
            "decrease",
        ),
        ({"strategy": "progressive"}, {"sampler": "single_pass", "steps": 32}, "high_to_low"),
        (CHAIN, {"sampler": "single_pass", "steps": 32, "block_length": 8}, "sample.block_length"),
    ],
)
def test_chain_settings_that_cannot_work_are_refused(tiny, prog, sample, needle):
    with pytest.raises(StackWiseError, match=needle):
        tiny(
            model={"n_stacks": 2, "blocks_per_stack": 1},
            objective={"name": "diffusion"},
            progressive=prog,
            sample=sample,
        )


def test_chain_needs_no_time_embedding(tiny):
    with pytest.raises(StackWiseError, match="time_conditioning: none"):
        tiny(
            model={"n_stacks": 2, "blocks_per_stack": 1, "time_conditioning": "sinusoidal"},
            objective={"name": "diffusion"},
            progressive=CHAIN,
        )


def test_a_mapping_that_grows_noise_is_refused_for_a_chain(tiny):
    cfg = chain_config(tiny)
    from stackwise.pipeline import progressive_recipe

    with pytest.raises(StackWiseError, match="do not decrease"):
        from stackwise.data.pack import build_data
        from stackwise.pipeline import resolve_vocab

        data = build_data(cfg.data)
        cfg = resolve_vocab(cfg, len(data.tokenizer))
        tr = progressive_recipe(cfg, data, quiet=True, time_mapping=lambda g, n, s: (g / n, 1.0))
        tr.train_progressively()


def test_from_dict_round_trip_keeps_the_order(tiny):
    cfg = chain_config(tiny)
    again = from_dict(cfg.model_dump(mode="json"))
    assert again.progressive.depth_order == "high_to_low"
