"""Progressive training: every feature changes what training does, and these tests show it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stackwise.config import from_dict
from stackwise.data.pack import build_data
from stackwise.errors import StackWiseError
from stackwise.model.rack import Rack
from stackwise.objectives import build_objective
from stackwise.pipeline import progressive_recipe, resolve_vocab, train_from_config
from stackwise.progressive import (
    ActivationCache,
    KeyedSamples,
    ProgressiveRackBuilder,
    ProgressiveResult,
    StackRecord,
    StageModel,
    depth_range,
    summary_table,
)
from stackwise.runs import load_trained

PROG = {"strategy": "progressive", "steps_per_stack": 6}
DIFF = {"objective": {"name": "diffusion"}}


def grown(tiny, n_stacks=3, prog=None, **sections):
    """A Config for a progressive diffusion run of `n_stacks` one-block stacks."""
    model = {"n_stacks": n_stacks, "blocks_per_stack": 1, **sections.pop("model", {})}
    sections.setdefault("objective", {"name": "diffusion"})
    # stack budgets come from steps_per_stack; train.max_steps stays at its default
    sections["train"] = {"max_steps": 600, **sections.get("train", {})}
    return tiny(model=model, progressive={**PROG, **(prog or {})}, **sections)


def run(config):
    return train_from_config(config, quiet=True)


def state_of(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# -- 1. builder -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_builder_tracks_roles_by_object_while_growing(tiny, mode):
    cfg = tiny(model={"n_stacks": 3, "blocks_per_stack": 2})
    b = ProgressiveRackBuilder(cfg.model, 50, causal=True, building_mode=mode)
    rack_before = b.rack
    grown_stacks = []
    for k in range(3):
        new = b.add_stack()
        grown_stacks.append(new)
        assert len(new.blocks) == 2  # n_blocks defaults to blocks_per_stack
        b.freeze_trunk()
        b.set_anchor_trainable(k == 0)
        trainable = b.trainable_names()
        new_pos = b.position(new)
        assert new_pos == (k if mode == "append" else 0)
        for pos, stack in enumerate(b.rack.stacks):
            names = {f"stacks.{pos}.{n}" for n, _ in stack.named_parameters()}
            assert (names <= trainable) == (stack is new), (k, pos)
            assert not (names & trainable) or stack is new
        assert ("embed_tokens.weight" in trainable) == (k == 0)
        assert ("norm.weight" in trainable) == (k == 0)
    assert b.build_rack() is rack_before  # the very modules that were trained
    order = list(b.rack.stacks)
    expected = grown_stacks if mode == "append" else grown_stacks[::-1]
    assert all(a is e for a, e in zip(order, expected, strict=True))
    b.append_stack(n_blocks=3)
    assert len(b.new_stack.blocks) == 3


def test_builder_bf16_precision_and_lora_freeze(tiny):
    cfg = tiny(model={"n_stacks": 2, "blocks_per_stack": 1})
    b = ProgressiveRackBuilder(cfg.model, 50, causal=False)
    b.append_stack()
    s = b.append_stack(precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in s.parameters())
    out = b.rack(torch.randint(0, 50, (2, 8)))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert s.blocks[0].attn.q_proj.weight.grad.dtype == torch.bfloat16
    b.freeze_all_but_lora()
    assert b.trainable_names() == set()  # no adapters yet: nothing trains
    with pytest.raises(ValueError, match="give it an adapter"):
        b.append_stack(precision="nf4")
    with pytest.raises(ValueError, match="precision"):
        b.append_stack(precision="int3")


# -- 2. trainer -------------------------------------------------------------------------------


def test_frozen_trunk_keeps_trunk_and_head_after_first_stack(tiny):
    cfg = grown(tiny, 3)
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    snapshots = []
    orig = tr.train_stage

    def spy(index, n):
        snapshots.append((index, {id(s): state_of(s) for s in tr.builder.rack.stacks}))
        snapshots.append((index, state_of(tr.builder.rack.embed_tokens)))
        return orig(index, n)

    tr.train_stage = spy
    result = tr.train_progressively()
    stacks = list(tr.builder.rack.stacks)
    # after training, stack 0 equals what stack 0 was when stack 2 started
    before_last = snapshots[4][1]
    assert same(before_last[id(stacks[0])], state_of(stacks[0]))
    assert same(before_last[id(stacks[1])], state_of(stacks[1]))
    # embeddings trained with stack 0 only (train_first)
    assert not same(snapshots[1][1], snapshots[3][1])
    assert same(snapshots[3][1], state_of(tr.builder.rack.embed_tokens))
    assert [r.index for r in result.stacks] == [0, 1, 2]
    hist = json.loads((tr.output_dir / "progressive_history.json").read_text())
    assert [s["steps"] for s in hist["stacks"]] == [6, 6, 6]
    assert all(s["tokens"] == 6 * 4 * 32 for s in hist["stacks"])
    assert all(s["eval"]["loss"] > 0 and s["seconds"] > 0 for s in hist["stacks"])
    assert hist["final_eval"]["nelbo"] > 0


@pytest.mark.parametrize(
    ("policy", "trunk", "embed_changes_late", "trunk_changes"),
    [
        ("always", "frozen", True, False),
        ("frozen", "frozen", False, False),
        ("train_first", "full", False, True),
    ],
)
def test_head_policy_and_trunk_strategy(tiny, policy, trunk, embed_changes_late, trunk_changes):
    cfg = grown(tiny, 2, {"head_policy": policy, "trunk_strategy": trunk})
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    start_embed = state_of(tr.builder.rack.embed_tokens)
    tr.train_stage(0, 2)
    mid_embed = state_of(tr.builder.rack.embed_tokens)
    stack0 = state_of(tr.builder.rack.stacks[0])
    mid_norm = state_of(tr.builder.rack.norm)
    tr.train_stage(1, 2)
    assert same(start_embed, mid_embed) == (policy == "frozen")
    assert (not same(mid_norm, state_of(tr.builder.rack.norm))) == embed_changes_late
    assert (not same(mid_embed, state_of(tr.builder.rack.embed_tokens))) == embed_changes_late
    assert (not same(stack0, state_of(tr.builder.rack.stacks[0]))) == trunk_changes


def test_per_stack_budget_lr_and_objective_overrides(tiny):
    cfg = grown(
        tiny,
        3,
        {
            "steps_per_stack": 3,
            "stacks": {
                1: {"steps": 5, "lr": 1e-5},
                2: {"epochs": 1.0, "objective": {"name": "mlm"}},
            },
        },
    )
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    seen = {}
    import stackwise.progressive.recipe as recipe

    real = recipe.build_trainer

    def spy(plan, model, objective, *a, **k):
        seen[len(seen)] = (plan.train.max_steps, plan.train.lr, objective.name)
        return real(plan, model, objective, *a, **k)

    recipe.build_trainer = spy
    try:
        tr.train_progressively()
    finally:
        recipe.build_trainer = real
    per_epoch = math.ceil(len(data.train) / 4)
    assert seen[0] == (3, cfg.train.lr, "diffusion")
    assert seen[1] == (5, 1e-5, "diffusion")
    assert seen[2] == (per_epoch, cfg.train.lr, "mlm")


def test_qlora_trunk_without_trunk_adapters_is_refused(tiny):
    """qlora trains only trunk adapters: without them the setting would do nothing."""
    with pytest.raises(StackWiseError, match=r"lora\.trunk_adapters: true"):
        grown(tiny, 2, {"trunk_strategy": "qlora"})


# -- 3. activation cache ----------------------------------------------------------------------


def _stage(tiny, cache_kwargs=None, n_keys=None):
    """A 3-stack rack mid-growth: two frozen trunk stacks, a new third, a cache over the data."""
    cfg = grown(tiny, 3, {"cache": {"enabled": True}})
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    b = ProgressiveRackBuilder(cfg.model, cfg.model.vocab_size, False)
    for _ in range(3):
        b.append_stack()
    b.freeze_trunk()
    b.set_anchor_trainable(False)
    samples = KeyedSamples(data.train, 2, seed=0)
    cache = ActivationCache(n_keys or len(samples), 32, cfg.model.d_model, **(cache_kwargs or {}))
    return cfg, data, b, StageModel(b.rack, b.new_stack, cache), samples


def _batch(samples, idx):
    items = [samples[i] for i in idx]
    return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}


def test_cache_hits_skip_the_trunk_and_match_recomputation(tiny):
    cfg, data, b, model, samples = _stage(tiny)
    obj = build_objective(cfg, data.specials)
    calls = {"n": 0}
    for stack in b.trunk:
        stack.register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    batch = _batch(samples, [0, 1, 5, 9])
    prep = obj.prepare(batch, torch.Generator())
    first = model(prep.inputs, None, None, cache_key=batch["cache_key"])
    assert calls["n"] == 2 and model.cache.stats.misses == 4 and model.cache.stats.hits == 0
    prep2 = obj.prepare(batch, torch.Generator().manual_seed(99))  # keyed: same masks anyway
    assert torch.equal(prep.inputs, prep2.inputs)
    second = model(prep2.inputs, None, None, cache_key=batch["cache_key"])
    assert calls["n"] == 2, "a hit must not run the trunk"
    assert model.cache.stats.hits == 4
    assert torch.equal(first, second)
    # cached hidden states equal a fresh trunk forward within bf16 rounding
    with torch.no_grad():
        fresh = b.rack.run_stacks(b.rack.embed(prep.inputs), None, b.trunk)
    cached = model.cache.read(2, batch["cache_key"].tolist()).float()
    torch.testing.assert_close(cached, fresh, rtol=1e-2, atol=1e-2)
    assert (cached - fresh).abs().max() > 0  # it really is the stored bf16 copy


def test_cache_budget_evicts_lru_or_errors(tiny):
    entry = 32 * 32 * 2
    *_, model, _ = _stage(tiny, {"max_bytes": 3 * entry})
    model.cache.write(2, [0, 1, 2], torch.zeros(3, 32, 32))
    model.cache.lookup(2, [0])  # 0 is now the most recent
    model.cache.write(2, [3], torch.ones(1, 32, 32))
    assert sorted(model.cache.entries(2)) == [0, 2, 3]  # 1 was least recently used
    assert model.cache.stats.evictions == 1 and model.cache.nbytes == 3 * entry
    strict = ActivationCache(10, 32, 32, max_bytes=2 * entry, on_full="error")
    strict.write(0, [0, 1], torch.zeros(2, 32, 32))
    with pytest.raises(StackWiseError, match="cache is full"):
        strict.write(0, [2], torch.zeros(1, 32, 32))


def _cached_run(tiny, tmp_path, name, **cache):
    cfg = grown(
        tiny,
        3,
        {"steps_per_stack": 8, "cache": {"enabled": True, **cache}},
        train={"output_dir": str(tmp_path / name), "batch_size": 8},
        data={"num_samples": 16},
    )
    return run(cfg)


def test_cache_is_read_and_disk_equals_memory(tiny, tmp_path):
    mem = _cached_run(tiny, tmp_path, "mem")
    disk = _cached_run(tiny, tmp_path, "disk", storage="disk", dir=str(tmp_path / "cdir"))
    for a, b in zip(mem.rack.parameters(), disk.rack.parameters(), strict=True):
        assert torch.equal(a, b)
    last = mem.progressive.stacks[-1].cache
    # 16 samples x 1 variant, 8 steps of 8: stack 2 reuses entries carried from stack 1
    assert last["carried"] == 16 and last["hits"] == 64 and last["trunk_forwards"] == 0
    first = mem.progressive.stacks[1].cache
    assert first["misses"] == 16 and first["hits"] == 48
    # disk mode wrote under cache.dir (which it created) and removed its files when done
    assert (tmp_path / "cdir").is_dir() and not any((tmp_path / "cdir").iterdir())


def test_cache_without_hits_trains_like_no_cache(tiny, tmp_path):
    """The cache changes where the trunk output comes from, not what training computes."""
    on = _cached_run(tiny, tmp_path, "on", dtype="fp16")
    assert on.progressive.stacks[2].cache["hits"] > 0
    assert math.isfinite(on.progressive.final_eval["nelbo"])


def _record(index: int, cache: dict, t_range: tuple[float, float] | None) -> StackRecord:
    return StackRecord(index, index, 1, 64, 1.0, 10, t_range, 1.0, {"loss": 1.0}, cache)


@pytest.mark.parametrize("t_range", [None, (0.0, 0.5)], ids=["by-stack", "time-as-depth"])
def test_a_cache_never_read_is_said_why_in_the_summary(t_range):
    """0% in the cache column is explained (no stage saw a sample twice), not left to look
    like a cache that does nothing; a cache that hit, or none, adds no line."""

    def note(caches: list[dict]) -> list[str]:
        stacks = [_record(i, c, t_range) for i, c in enumerate(caches)]
        table = summary_table(ProgressiveResult(None, Path("."), stacks, {}))  # type: ignore[arg-type]
        return [line for line in table.splitlines() if line.startswith("cache:")]

    unread = {"hits": 0, "misses": 8, "carried": 0}
    (said,) = note([{}, unread, unread])
    assert "never read" in said and "one pass" in said
    assert ("time as depth" in said) == (t_range is not None)
    assert note([{}, unread, {"hits": 3, "misses": 5, "carried": 8}]) == []
    assert note([{}, {}]) == []  # no cache at all
    assert note([{}, {"hits": 0, "misses": 0, "carried": 0}]) == []  # nothing stored
    (said,) = note([{}, {**unread, "evictions": 4}])  # a budget too small was the cause
    assert "evicted" in said and "max_bytes" in said and "one pass" not in said


def test_cache_variants_and_modes(tiny, tmp_path):
    cfg = grown(
        tiny,
        3,
        {
            "steps_per_stack": 4,
            "cache": {"enabled": True, "time_step_cache_size": 3, "mode": "rack"},
        },
        train={"output_dir": str(tmp_path / "r"), "batch_size": 8},
        data={"num_samples": 8},
    )
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    for i in range(3):
        tr.train_stage(i, 3)
    assert tr.cache.n_keys == 8 * 3  # three masked variants per sample
    assert sorted(tr.cache.stores) == [1, 2]  # mode rack keeps every boundary
    all_steps = grown(
        tiny,
        2,
        {"cache": {"enabled": True, "store_all_time_steps": True}},
        masking={"num_time_steps": 5},
        data={"num_samples": 8},
    )
    data2 = build_data(all_steps.data)
    all_steps = resolve_vocab(all_steps, len(data2.tokenizer))
    tr2 = progressive_recipe(all_steps, data2, quiet=True)
    tr2.train_stage(0, 2)
    tr2.train_stage(1, 2)
    assert tr2.cache.n_keys == 8 * 5  # one entry per sample and grid step
    keyed = KeyedSamples(data2.train, 5, 0, [(k + 1) / 5 for k in range(5)])
    assert [float(keyed[j]["t"]) for j in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_cache_refuses_settings_where_it_would_go_stale(tiny):
    for prog in (
        {"building_mode": "prepend"},
        {"trunk_strategy": "full"},
        {"head_policy": "always"},
    ):
        with pytest.raises(StackWiseError, match="cache"):
            grown(tiny, 2, {**prog, "cache": {"enabled": True}})
    with pytest.raises(StackWiseError, match=r"cache\.enabled"):
        grown(tiny, 2, {"cache": {"storage": "disk"}})


# -- 4. time as depth -------------------------------------------------------------------------


def test_depth_mappings_and_orders(tiny):
    cfg = grown(tiny, 4, {"time_interpretation": "depth"}).progressive
    assert [depth_range(i, 4, cfg) for i in range(4)] == [
        (0.0, 0.25),
        (0.25, 0.5),
        (0.5, 0.75),
        (0.75, 1.0),
    ]
    exp = grown(
        tiny, 3, {"time_interpretation": "depth", "depth_mapping": "exponential"}
    ).progressive
    widths = [hi - lo for lo, hi in (depth_range(i, 3, exp) for i in range(3))]
    assert widths[1] == pytest.approx(2 * widths[0]) and widths[2] == pytest.approx(4 * widths[0])
    table = grown(
        tiny,
        2,
        {
            "time_interpretation": "depth",
            "depth_mapping": "custom",
            "depth_time_table": [0.3, [0.5, 1.0]],
        },
    ).progressive
    assert depth_range(0, 2, table) == (0.3, 0.3) and depth_range(1, 2, table) == (0.5, 1.0)
    grid = grown(
        tiny,
        2,
        {"time_interpretation": "depth", "time_per_stack": 5},
        masking={"num_time_steps": 10},
    ).progressive
    assert depth_range(1, 2, grid, 10) == (0.5, 1.0)
    # sampling starts from full noise: ranges that stop short of t = 1 are refused
    short = [
        ({"depth_mapping": "custom", "depth_time_table": [0.3, [0.5, 0.9]]}, {}),
        ({"time_per_stack": 2}, {"num_time_steps": 10}),
    ]
    for extra, masking in short:
        with pytest.raises(StackWiseError, match=r"up to t=0\.(9|4) only"):
            grown(tiny, 2, {"time_interpretation": "depth", **extra}, masking=masking)
    assert depth_range(1, 2, cfg, mapping=lambda i, n, t: (0.1 * i, 0.1 * i + 0.05)) == (
        0.1,
        0.15000000000000002,
    )


@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_each_stack_sees_its_mapped_mask_fraction(tiny, mode):
    cfg = grown(
        tiny,
        3,
        {"time_interpretation": "depth", "steps_per_stack": 12, "building_mode": mode},
        masking={"antithetic": False},
    )
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    fractions: dict[int, list[float]] = {}
    mask_id = data.specials.mask_id

    real_forward = StageModel.forward
    current: list[float] = []

    def spy(self, input_ids, *a, **k):
        if self.training:  # training batches only (eval uses the stack's range too)
            current.append(float((input_ids == mask_id).float().mean()))
        return real_forward(self, input_ids, *a, **k)

    StageModel.forward = spy
    try:
        for i in range(3):
            current = fractions.setdefault(i, [])
            tr.train_stage(i, 3)
    finally:
        StageModel.forward = real_forward
    means = [sum(v) / len(v) for v in (fractions[i] for i in range(3))]
    # linear schedule: mask fraction = t, uniform over stack i's range (i/3, (i+1)/3]
    for i, m in enumerate(means):
        assert abs(m - (i + 0.5) / 3) < 0.06, means
        assert all(i / 3 - 0.08 <= f <= (i + 1) / 3 + 0.08 for f in fractions[i])
    positions = [r for r in (tr.builder.position(s) for s in tr.builder.grown)]
    assert positions == ([0, 1, 2] if mode == "append" else [2, 1, 0])


def test_depth_needs_diffusion(tiny):
    with pytest.raises(StackWiseError, match="depth"):
        tiny(
            model={"n_stacks": 2},
            progressive={"strategy": "progressive", "time_interpretation": "depth"},
        )


# -- 5. scopes and modes ----------------------------------------------------------------------


class SavedBytes:
    """Peak bytes of tensors saved for backward that are alive at the same time."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def __enter__(self):
        meter = self

        class Holder:
            def __init__(self, t: torch.Tensor) -> None:
                self.t, self.n = t, t.numel() * t.element_size()
                meter.live += self.n
                meter.peak = max(meter.peak, meter.live)

            def __del__(self) -> None:
                meter.live -= self.n

        self.ctx = torch.autograd.graph.saved_tensors_hooks(Holder, lambda h: h.t)
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)


def test_stackwise_scope_peak_activation_memory_is_about_one_stack(tiny, tmp_path):
    peaks = {}
    for scope in ("rackwise", "stackwise"):
        cfg = tiny(
            model={"n_stacks": 6, "blocks_per_stack": 1, "d_model": 64, "n_heads": 2},
            objective={"name": "diffusion"},
            progressive={"end_to_end_scope": scope},
            train={"max_steps": 1, "output_dir": str(tmp_path / scope), "batch_size": 8},
        )
        data = build_data(cfg.data)
        cfg = resolve_vocab(cfg, len(data.tokenizer))
        from stackwise import build_rack
        from stackwise.pipeline import trainer_for
        from stackwise.strategies import get_training_strategy

        strategy = "local_losses" if scope == "stackwise" else "standard"
        tr = trainer_for(
            cfg,
            build_rack(cfg, cfg.model.vocab_size),
            build_objective(cfg, data.specials),
            data.train,
            strategy=get_training_strategy(strategy),
        )
        batches = tr.batches()
        with SavedBytes() as meter:
            tr.optimizer_step(batches)
        peaks[scope] = meter.peak
    # six stacks: the local-loss step keeps one stack's activations (plus the head's) alive
    assert peaks["stackwise"] < 0.45 * peaks["rackwise"], peaks


def test_stackwise_scope_trains_every_stack_and_lowers_loss(tiny):
    cfg = tiny(
        model={"n_stacks": 3, "blocks_per_stack": 1},
        progressive={"end_to_end_scope": "stackwise"},
        train={"max_steps": 30, "eval_every": 30},
    )
    res = run(cfg)
    hist = [h["loss"] for h in res.state.history]
    assert hist[-1] < hist[0] - 0.5
    rack0 = Rack(cfg.model, res.rack.vocab_size, True)
    assert all(
        not torch.equal(a, b)
        for a, b in zip(rack0.stacks.parameters(), res.rack.stacks.parameters(), strict=True)
        if a.ndim == 2
    )


def test_modes_set_the_stack_shape_and_fused_tunes_jointly(tiny):
    assert grown(tiny, 2, {"mode": "layerwise"}).model.blocks_per_stack == 1
    cfg = from_dict(
        {
            "model": {"n_stacks": 2},
            "objective": {"name": "diffusion"},
            "progressive": {**PROG, "mode": "blockwise", "block_size": 3},
        }
    )
    assert cfg.model.blocks_per_stack == 3
    with pytest.raises(StackWiseError, match="blocks_per_stack"):
        tiny(
            model={"n_stacks": 2, "blocks_per_stack": 2},
            progressive={**PROG, "mode": "layerwise"},
        )
    with pytest.raises(StackWiseError, match="joint_tuning_steps"):
        grown(tiny, 2, {"mode": "fused"})
    fused = run(grown(tiny, 2, {"mode": "fused", "joint_tuning_steps": 5}))
    assert fused.progressive.joint["steps"] == 5
    hist = json.loads((fused.output_dir / "progressive_history.json").read_text())
    assert hist["joint"]["steps"] == 5
    assert (fused.output_dir / "joint" / "metrics.jsonl").is_file()


# -- 6. saving --------------------------------------------------------------------------------


def test_stacks_are_saved_and_reload_alone_with_identical_logits(tiny, tmp_path):
    cfg = grown(
        tiny,
        3,
        {"save_rack": False, "building_mode": "prepend"},
        model={"time_conditioning": "sinusoidal"},
        train={"output_dir": str(tmp_path / "runs" / "r1")},
    )
    res = run(cfg)
    out = res.output_dir
    assert not (out / "model.safetensors").exists()
    for g in range(3):
        meta = json.loads((out / "stacks" / f"stack_{g}.json").read_text())
        assert meta["growth_index"] == g and meta["position"] == 2 - g  # prepend
        assert load_file(str(out / "stacks" / f"stack_{g}.safetensors"))
        assert (out / f"stack_{g}" / "metrics.jsonl").is_file()
    _, rack, _ = load_trained(out)
    ids = torch.randint(0, res.rack.vocab_size, (2, 16))
    t = torch.tensor([0.3, 0.8])
    res.rack.eval()
    assert torch.equal(rack(ids, None, t), res.rack(ids, None, t))
    # everything lives under the run dir
    assert {p.name for p in out.iterdir()} >= {"stacks", "config.yaml", "tokenizer"}


def test_save_rack_writes_the_full_rack(tiny):
    res = run(grown(tiny, 2))
    _, rack, _ = load_trained(res.output_dir)
    assert (res.output_dir / "model.safetensors").is_file()
    ids = torch.randint(0, res.rack.vocab_size, (1, 8))
    assert torch.equal(rack(ids), res.rack.eval()(ids))
    with pytest.raises(StackWiseError, match="nothing would be saved"):
        grown(tiny, 2, {"save_rack": False, "save_stacks": False})


def test_end_to_end_config_refuses_progressive_only_keys(tiny):
    with pytest.raises(StackWiseError, match="strategy: progressive"):
        tiny(progressive={"head_policy": "always"})
    cfg = from_dict({"progressive": {"strategy": "progressive"}})
    assert cfg.progressive.save_stacks


# -- review fixes -----------------------------------------------------------------------------


def test_bf16_stacks_reload_identically_with_an_untied_head(tiny):
    res = run(grown(tiny, 2, {"new_stack_precision": "bf16"}, model={"tie_embeddings": False}))
    _, rack, _ = load_trained(res.output_dir)
    assert all(p.dtype == torch.bfloat16 for p in rack.stacks[1].parameters())
    ids = torch.randint(0, res.rack.vocab_size, (2, 16))
    assert torch.equal(rack(ids), res.rack.eval()(ids))


def test_partial_growth_saves_a_loadable_rack_and_keeps_the_depth_mapping(tiny):
    cfg = grown(tiny, 4, {"time_interpretation": "depth"})
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    res = tr.train_progressively(target_stacks=2)
    assert [r.t_range for r in res.stacks] == [(0.0, 0.25), (0.25, 0.5)]  # over 4 stacks
    tr.save(data.tokenizer)
    _, rack, _ = load_trained(tr.output_dir)
    assert len(rack.stacks) == 2
    ids = torch.randint(0, cfg.model.vocab_size, (2, 8))
    t = torch.tensor([0.1, 0.4])  # a depth-time rack is routed by noise level: it takes t
    assert rack.depth_ranges == [(0, 0.0, 0.25), (1, 0.25, 0.5)]
    assert torch.equal(rack(ids, t=t), res.rack.eval()(ids, t=t))


def test_epoch_budgets_count_samples_not_cached_variants(tiny):
    on = grown(
        tiny,
        2,
        {
            "steps_per_stack": None,
            "epochs_per_stack": 0.5,
            "cache": {"enabled": True, "time_step_cache_size": 4},
        },
    )
    data = build_data(on.data)
    on = resolve_vocab(on, len(data.tokenizer))
    tr = progressive_recipe(on, data, quiet=True)
    assert tr.plan.stages[1].steps == math.ceil(0.5 * len(data.train) / 4)


def test_max_steps_beside_a_per_stack_budget_is_refused(tiny):
    with pytest.raises(StackWiseError, match="max_steps has no effect"):
        grown(tiny, 2, train={"max_steps": 100, "eval_every": 2})


def test_finished_progressive_run_is_not_overwritten(tiny):
    cfg = grown(tiny, 2, {"save_rack": False})
    run(cfg)
    with pytest.raises(StackWiseError, match="already holds"):
        run(cfg)


def test_depth_stages_are_evaluated_on_the_full_noise_range(tiny):
    cfg = grown(tiny, 2, {"time_interpretation": "depth"})
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    import stackwise.progressive.recipe as recipe

    seen = []
    real = recipe.build_trainer

    def spy(*a, **k):
        trainer = real(*a, **k)
        seen.append((trainer.objective.t_range, trainer.data.evaluator.objective.t_range))
        return trainer

    recipe.build_trainer = spy
    try:
        tr.train_stage(0, 2)
    finally:
        recipe.build_trainer = real
    assert seen == [((0.0, 0.5), (0.0, 1.0))]


def test_rack_mode_misses_start_from_the_deepest_cached_boundary(tiny):
    cfg, data, b, model, samples = _stage(tiny, {"mode": "rack", "boundaries": 2})
    obj = build_objective(cfg, data.specials)
    batch = _batch(samples, [0, 1])
    prep = obj.prepare(batch, torch.Generator())
    with torch.no_grad():
        h1 = b.rack.run_stacks(b.rack.embed(prep.inputs), None, b.trunk[:1])
    model.cache.write(1, batch["cache_key"].tolist(), h1)  # boundary 1 known, boundary 2 not
    calls = {"n": 0}
    b.trunk[0].register_forward_hook(lambda *a: calls.__setitem__("n", calls["n"] + 1))
    model(prep.inputs, None, None, cache_key=batch["cache_key"])
    assert calls["n"] == 0 and model.cache.trunk_calls == 0  # only trunk stack 1 ran
    assert sorted(model.cache.stores) == [1, 2]


def test_fixed_shards_keep_each_rank_on_its_own_keys():
    from stackwise.train.sampler import EpochSampler

    seen = {}
    for rank in (0, 1):
        s = EpochSampler(10, 3, rank, 2, fixed_shard=True)
        orders = []
        for epoch in range(3):
            s.epoch = epoch
            orders.append(s.order())
        assert all(sorted(o) == sorted(orders[0]) for o in orders)
        assert orders[0] != orders[1]  # still shuffled within the shard
        seen[rank] = set(orders[0])
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 10


def test_huge_seeds_do_not_overflow_mask_keys(tiny):
    res = run(grown(tiny, 2, {"cache": {"enabled": True}}, train={"seed": 2**31 - 1}))
    assert math.isfinite(res.progressive.final_eval["nelbo"])
    with pytest.raises(StackWiseError, match=r"train\.seed"):
        grown(tiny, 2, train={"seed": 2**40})


def test_fused_joint_tuning_trains_everything_trainable_with_a_qlora_trunk(tiny, monkeypatch):
    """Joint tuning after a qlora-trunk growth trains embeddings, norms, the last full-precision
    stack and the adapters; only the packed quantized codes stay as they were."""
    from stackwise.pipeline import train_from_config
    from stackwise.progressive.recipe import ProgressiveTrainer

    before: dict[str, torch.Tensor] = {}
    original = ProgressiveTrainer.joint_tuning

    def snapshot_then_tune(self):
        before.update({n: p.detach().clone() for n, p in self.builder.rack.named_parameters()})
        return original(self)

    monkeypatch.setattr(ProgressiveTrainer, "joint_tuning", snapshot_then_tune)
    cfg = tiny(
        model={"n_stacks": 2, "blocks_per_stack": 1},
        objective={"name": "diffusion"},
        train={"max_steps": 600},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": 2,
            "trunk_strategy": "qlora",
            "mode": "fused",
            "joint_tuning_steps": 3,
        },
        lora={"enabled": True, "trunk_adapters": True},
        quant={"enabled": True, "type": "nf4"},
    )
    res = train_from_config(cfg, quiet=True)
    after = {n: p.detach() for n, p in res.rack.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert any(n.startswith("embed_tokens") for n in changed)
    assert any("norm" in n and "lora_" not in n for n in changed)
    assert any("lora_" in n for n in changed)
    last = [
        n for n in changed if "proj" in n and "lora_" not in n and before[n].is_floating_point()
    ]
    assert last, "the last-grown full-precision stack did not train"
    assert not any(not before[n].is_floating_point() for n in changed)  # codes never move


def test_time_as_depth_racks_sample_and_score_routed_by_noise_level(tiny):
    """Stage k trained stacks 0..k (frozen below k) with the head for its noise range; the
    routed rack runs exactly that sub-rack for a t in that range, saved and reloaded alike, and
    on held-back data it scores at least as well as running every stack for every t."""
    from stackwise.generate import generate

    cfg = grown(
        tiny,
        3,
        {"time_interpretation": "depth", "steps_per_stack": 40},
        train={"eval_batches": 8},
    )
    res = run(cfg)
    f = res.progressive.final_eval
    assert f["nelbo"] <= f["whole_rack_nelbo"] + 1e-6, f
    _, rack, tok = load_trained(res.output_dir)
    assert [r[0] for r in rack.depth_ranges] == [0, 1, 2] and rack.uses_time
    x = torch.randint(4, len(tok), (2, 16))
    t = torch.tensor([0.1, 0.9])  # stack 0's range, and the last stack's
    with torch.no_grad():
        routed = rack(x, t=t)
        only_first = rack.logits(rack.run_stacks(rack.embed(x[:1]), stacks=rack.stacks[:1]))
        every = rack.logits(rack.run_stacks(rack.embed(x[1:])))
    assert torch.allclose(routed[:1], only_first, atol=1e-5)
    assert torch.allclose(routed[1:], every, atol=1e-5)
    got = generate(res.config, rack, tok, n=2)
    assert got.stats.forward_passes > 0 and len(got.texts) == 2


def test_growing_a_depth_rack_again_after_it_was_scored(tiny):
    """The finished rack is routed by noise level; growing it further starts unrouted."""
    cfg = grown(tiny, 3, {"time_interpretation": "depth"})
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    first = tr.train_progressively(target_stacks=2)
    assert first.rack.depth_ranges is not None and len(first.rack.depth_ranges) == 2
    again = tr.train_progressively(target_stacks=3)
    assert len(again.rack.depth_ranges) == 3 and "whole_rack_nelbo" in again.final_eval


def test_group_lr_trunk_sets_the_lr_of_stacks_grown_earlier(tiny):
    """With a trainable trunk, train.group_lr.trunk is the LR of the earlier stacks only; the new
    stack keeps train.lr (and the trunk stacks really step at the lower rate)."""
    cfg = grown(
        tiny,
        2,
        {"trunk_strategy": "full", "head_policy": "always", "steps_per_stack": 3},
        train={"lr": 1e-2, "group_lr": {"trunk": 1e-4}, "scheduler": "constant"},
    )
    data = build_data(cfg.data)
    cfg = resolve_vocab(cfg, len(data.tokenizer))
    tr = progressive_recipe(cfg, data, quiet=True)
    tr.train_progressively(target_stacks=1)
    trunk_before = state_of(tr.builder.rack.stacks[0])
    tr.train_progressively(target_stacks=2)
    groups = {g["name"]: g for g in tr.last_trainer.optimizer.param_groups}
    trunk_ids = {id(p) for p in tr.builder.rack.stacks[0].parameters()}
    new_ids = {id(p) for p in tr.builder.rack.stacks[1].parameters()}
    assert groups["trunk"]["lr"] == pytest.approx(1e-4)
    assert groups["blocks"]["lr"] == pytest.approx(1e-2)
    assert {id(p) for p in groups["trunk"]["params"]} <= trunk_ids
    assert {id(p) for p in groups["blocks"]["params"]} <= new_ids
    moved = max(
        (v - trunk_before[k]).abs().max().item()
        for k, v in tr.builder.rack.stacks[0].state_dict().items()
    )
    assert 0 < moved < 3 * 1e-4 * 1.5  # Adam moves a weight by about lr per step


def test_group_lr_trunk_needs_a_trunk_that_trains(tiny):
    with pytest.raises(StackWiseError, match=r"group_lr\.trunk"):
        grown(tiny, 2, {}, train={"group_lr": {"trunk": 1e-4}})


def test_global_lr_schedule_warms_up_once_and_decays_across_stages(tiny):
    """lr_schedule global: stage k continues one schedule over every stage's steps; per_stage
    restarts it (warmup included) at every stage."""
    from stackwise.train.optim import lr_factor

    def lrs(schedule):
        cfg = grown(
            tiny,
            2,
            {"steps_per_stack": 6, "lr_schedule": schedule},
            train={
                "lr": 1e-2,
                "warmup_steps": 2,
                "scheduler": "linear",
                "min_lr_ratio": 0.1,
                "overwrite_output_dir": True,
            },
        )
        data = build_data(cfg.data)
        cfg = resolve_vocab(cfg, len(data.tokenizer))
        tr = progressive_recipe(cfg, data, quiet=True)
        seen = []
        for target in (1, 2):
            tr.train_progressively(target_stacks=target)
            sch = tr.last_trainer.scheduler
            seen.append((sch.last_epoch, sch.get_last_lr()[0]))
        return cfg, seen

    cfg, seen = lrs("global")
    whole = cfg.train.model_copy(update={"max_steps": 12})
    assert seen[0] == (6, pytest.approx(1e-2 * lr_factor(6, whole)))
    assert seen[1] == (6, pytest.approx(1e-2 * lr_factor(12, whole)))  # stage 1: steps 6..12
    assert seen[0][1] > seen[1][1] == pytest.approx(1e-3)
    _, restarted = lrs("per_stage")
    assert restarted[0][1] == pytest.approx(restarted[1][1]) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("objective", "interpretation", "conditioning", "said"),
    [
        ("diffusion", "input", "none", ", every stage on every noise level, no time input"),
        ("diffusion", "input", "sinusoidal", ", time as input (sinusoidal)"),
        ("diffusion", "depth", "none", ", time as depth"),
        ("clm", "input", "none", ""),
    ],
)
def test_the_growth_header_says_how_the_stages_see_time(
    objective, interpretation, conditioning, said
):
    """ "time as input" only where the rack reads t (model.time_conditioning)."""
    from stackwise.strategies.progressive import time_note

    cfg = from_dict(
        {
            "model": {"n_stacks": 2, "time_conditioning": conditioning},
            "objective": {"name": objective},
            "progressive": {"strategy": "progressive", "time_interpretation": interpretation},
        },
        origin="test",
    )
    assert time_note(cfg) == said
