"""One registry protocol for every pluggable family: for each family a toy entry is registered
with one decorator line, picked by name, its declared capabilities read back, and (objective,
schedule, sampler, growth operator, parallelizer) used for real. Every toy is unregistered after
its test."""

from __future__ import annotations

import importlib
import itertools
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_dict
from torch import nn

import stackwise
from stackwise.config import from_dict
from stackwise.config.loading import InvalidConfig
from stackwise.errors import StackWiseError
from stackwise.objectives import CLM, Diffusion, Specials, build_objective, objective_from
from stackwise.objectives.schedules import Schedule
from stackwise.registry import (
    GROWTH_OPERATORS,
    OBJECTIVES,
    PARALLELIZERS,
    SAMPLERS,
    SCHEDULES,
    Family,
    read_declarations,
    source_files,
)
from stackwise.samplers import MaskedSampler, MaskedSampling, Stepwise
from stackwise.spec import MaskingSpec, ObjectiveSpec

BUILTIN_FAMILIES = [OBJECTIVES, SCHEDULES, SAMPLERS, GROWTH_OPERATORS, PARALLELIZERS]
MASK = 1


@pytest.fixture
def toys():
    """toys(family, name, **capabilities): `family.register`, undone after the test."""
    added: list[tuple[Family, str]] = []

    def register(family: Family, name: str, **capabilities):
        added.append((family, name))
        return family.register(name, **capabilities)

    yield register
    for family, name in added:
        family.unregister(name)
        assert name not in family.names()


def test_a_toy_objective_trains_from_a_config(tiny, toys):
    """clm with a ramp of weights over positions: named in objective.name, no config edit."""

    @toys(OBJECTIVES, "toy_ramp", causal=True, instruction_rows=True)
    class Ramp(CLM):
        prepared = 0

        def prepare(self, batch, gen):
            prep = super().prepare(batch, gen)
            ramp = torch.linspace(0.5, 1.5, prep.weights.shape[1], device=prep.weights.device)
            prep.weights = prep.weights * ramp
            Ramp.prepared += 1
            return prep

    caps = OBJECTIVES.capabilities("toy_ramp")
    assert (caps.causal, caps.instruction_rows, caps.masked, caps.uses_time) == (
        True,
        True,
        False,  # not declared: the family's default
        False,
    )
    cfg = tiny(objective={"name": "toy_ramp"}, train={"max_steps": 3, "eval_every": 3})
    assert cfg.objective.causal  # attention auto follows the declared capability
    assert isinstance(build_objective(cfg, Specials(50, 0, 1)), Ramp)
    res = stackwise.train_from_config(cfg, quiet=True)
    assert res.state.step == 3 and Ramp.prepared >= 3


def test_a_toy_schedule_drives_diffusion(tiny, toys):
    """mask fraction t^2 (NELBO weight 2/t), named in masking.schedule."""

    @toys(SCHEDULES, "toy_square")
    class Square(Schedule):
        def mask_fraction(self, t):
            return t * t

        def weight(self, t):
            return 2.0 / t

    assert SCHEDULES.capabilities("toy_square") == SCHEDULES.Capabilities()
    cfg = tiny(objective={"name": "diffusion"}, masking={"schedule": "toy_square"})
    obj = build_objective(cfg, Specials(vocab_size=50, pad_id=0, mask_id=MASK))
    assert isinstance(obj, Diffusion) and isinstance(obj.schedule, Square)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (64, 128), generator=gen)
    prep = obj.prepare({"input_ids": ids, "t": torch.full((64,), 0.5)}, gen)
    masked = prep.inputs == MASK
    assert 0.2 < masked.float().mean().item() < 0.3  # 0.5^2 of the tokens
    assert torch.all(prep.weights[masked] == 4.0) and torch.all(prep.weights[~masked] == 0)


class Peaked(nn.Module):
    """A rack whose logits always pick token 3; it records what it was given."""

    uses_time = False

    def __init__(self, length: int) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(max_seq_len=length)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, attention_mask=None, t=None):
        self.seen.append(x.clone())
        logits = torch.full((*x.shape, 8), -30.0)
        logits[..., 3] = 0.0
        return logits


def test_a_toy_sampler_is_dispatched_by_name(tiny, toys):
    """A sampler that reveals the leftmost masked position at each step."""

    @toys(SAMPLERS, "toy_left_to_right", uses_remasking=False)
    class LeftToRight(Stepwise):
        def reveal(self, masked, logits, tokens, j, steps):
            first = masked.float().argmax(1)
            out = torch.zeros_like(masked)
            out[torch.arange(masked.shape[0]), first] = True
            return out & masked

    caps = SAMPLERS.capabilities("toy_left_to_right")
    assert (caps.uses_remasking, caps.needs_chain) == (False, False)
    cfg = tiny(objective={"name": "mlm"}, sample={"sampler": "toy_left_to_right"})
    assert cfg.sample.resolved_sampler(cfg.objective.name) == "toy_left_to_right"
    rack = Peaked(7)
    settings = MaskedSampling(sampler=cfg.sample.sampler, steps=6, temperature=0)
    run = MaskedSampler(rack, settings, MASK, [MASK], torch.Generator().manual_seed(0))
    out = run.run(torch.full((2, 1), 5), 6)
    assert torch.equal(out[:, 1:], torch.full((2, 6), 3))
    revealed = [int((a[0] != MASK).sum() - (b[0] != MASK).sum()) for b, a in pairs(rack.seen)]
    assert revealed == [1] * 5  # one position per step ...
    assert [int((x[0] == MASK).nonzero()[0]) for x in rack.seen] == [1, 2, 3, 4, 5, 6]  # in order


def pairs(items: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(itertools.pairwise(items))


def test_a_toy_growth_operator_initialises_new_stacks(tiny, toys):
    """copy_last: a new stack starts as a copy of the last one (random for the first)."""
    from stackwise.progressive import ProgressiveRackBuilder

    @toys(GROWTH_OPERATORS, "toy_copy_last", preserves_function=False)
    def copy_last(growth):
        if not growth.trunk:
            GROWTH_OPERATORS.get("random")(growth)
            return
        with torch.no_grad():
            for mine, theirs in zip(
                growth.stack.parameters(), growth.trunk[-1].parameters(), strict=True
            ):
                mine.copy_(theirs)

    assert GROWTH_OPERATORS.capabilities("toy_copy_last").preserves_function is False
    cfg = tiny(model={"n_stacks": 3, "blocks_per_stack": 1})
    builder = ProgressiveRackBuilder(cfg.model, 50, causal=True, growth_operator="toy_copy_last")
    first, second = builder.add_stack(), builder.add_stack()
    pairs_ = list(zip(first.state_dict().items(), second.state_dict().items(), strict=True))
    assert pairs_ and all(torch.equal(a, b) for (_, a), (_, b) in pairs_)
    plain = ProgressiveRackBuilder(cfg.model, 50, causal=True)  # default: random
    one, two = plain.add_stack(), plain.add_stack()
    assert not torch.equal(one.blocks[0].attn.q_proj.weight, two.blocks[0].attn.q_proj.weight)
    with pytest.raises(StackWiseError, match=r"growth_operator names 'nope'.*Known: .*random"):
        ProgressiveRackBuilder(cfg.model, 50, causal=True, growth_operator="nope")


def test_random_growth_is_the_racks_own_initialisation(tiny):
    """`random` draws exactly what the builder drew before operators existed."""
    from stackwise.model.layers import Stack, init_weights
    from stackwise.progressive import ProgressiveRackBuilder

    cfg = tiny(model={"n_stacks": 2, "blocks_per_stack": 1})
    builder = ProgressiveRackBuilder(cfg.model, 50, causal=True)
    torch.manual_seed(7)
    grown = builder.add_stack()
    torch.manual_seed(7)
    by_hand = Stack(cfg.model, True, None, index=0)
    init_weights(by_hand, cfg.model.init_std, cfg.model.n_layers, cfg.model.d_model)
    mine, theirs = grown.state_dict(), by_hand.state_dict()
    assert list(mine) == list(theirs)
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name


class FakeAccelerator:
    device = torch.device("cpu")
    num_processes = 1

    def __init__(self) -> None:
        self.prepared: list[tuple[object, ...]] = []

    def prepare(self, *objects):
        self.prepared.append(objects)
        return objects if len(objects) > 1 else objects[0]


def test_parallelizers_place_and_sync(toys):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = FakeAccelerator()
    assert PARALLELIZERS.create("ddp").place(model, opt, acc) == (model, opt)
    assert acc.prepared == [(model, opt)]  # both through Accelerate
    acc = FakeAccelerator()
    manual = PARALLELIZERS.create("manual")
    assert manual.place(model, opt, acc) == (model, opt) and acc.prepared == [(opt,)]
    manual.sync_gradients(model, acc)  # one process: nothing to average
    assert PARALLELIZERS.capabilities("ddp").wraps_model
    assert not PARALLELIZERS.capabilities("manual").wraps_model

    @toys(PARALLELIZERS, "toy_shard", shards=True, wraps_model=False)
    class Shard:
        synced = 0

        def place(self, model, optimizer, accelerator):
            return model.to(accelerator.device), optimizer

        def sync_gradients(self, raw_model, accelerator):
            Shard.synced += 1

    caps = PARALLELIZERS.capabilities("toy_shard")
    assert (caps.shards, caps.wraps_model) == (True, False)
    chosen = PARALLELIZERS.create("toy_shard")
    assert chosen.place(model, opt, FakeAccelerator()) == (model, opt)
    chosen.sync_gradients(model, FakeAccelerator())
    assert Shard.synced == 1 and chosen.name == "toy_shard"


def test_the_first_families_share_the_protocol():
    """Strategies, model adapters and extensions: their decorators as before, plus names(),
    get() and (empty) capabilities."""
    from stackwise.strategies.base import REGISTERED
    from stackwise.train.adapters import ADAPTERS
    from stackwise.train.extensions import EXTENSIONS, build_extensions

    @stackwise.register_training_strategy("toy_noop")
    class Noop(stackwise.TrainingStrategy):
        def run(self, config, data, adapter, quiet):
            raise AssertionError("registered to be listed and looked up, never run")

    @stackwise.register_model_adapter("toy_adapter")
    class Adapter(stackwise.ModelAdapter):
        def build(self, config, vocab_size):
            return nn.Linear(2, 2)

    @stackwise.register_extension("toy_extension")
    class Probe(stackwise.Extension):
        pass

    try:
        assert isinstance(stackwise.get_training_strategy("toy_noop"), Noop)
        assert isinstance(stackwise.get_model_adapter("toy_adapter"), Adapter)
        (ext,) = build_extensions(["toy_extension"])
        assert isinstance(ext, Probe) and ext.name == "toy_extension"
        for family, name in (
            (REGISTERED, "toy_noop"),
            (ADAPTERS, "toy_adapter"),
            (EXTENSIONS, "toy_extension"),
        ):
            assert name in family.names()
            assert family.capabilities(name) == family.Capabilities()
    finally:
        REGISTERED.unregister("toy_noop")
        ADAPTERS.unregister("toy_adapter")
        EXTENSIONS.unregister("toy_extension")


def test_objective_from_takes_specs():
    """The real entry builds from anything with the objective/masking fields (frozen specs)."""
    specials = Specials(vocab_size=50, pad_id=0, mask_id=MASK)
    spec = ObjectiveSpec(name="diffusion", weighting="uniform", causal=False)
    obj = objective_from(spec, MaskingSpec(schedule="cosine", num_time_steps=8), specials)
    assert isinstance(obj, Diffusion) and obj.uniform_weight and obj.num_time_steps == 8
    assert type(obj.schedule).__name__ == "Cosine" and not obj.causal
    mlm = objective_from(ObjectiveSpec(name="mlm", causal=False), MaskingSpec(0.3), specials)
    assert (mlm.lo, mlm.hi, mlm.name) == (0.3, 0.3, "mlm")


def test_unknown_names_and_capabilities_are_refused(tiny, toys):
    with pytest.raises(StackWiseError, match=r"declares unknown capabilities \['fast'\]"):
        OBJECTIVES.register("toy_fast", fast=True)
    with pytest.raises(StackWiseError) as err:
        OBJECTIVES.get("difusion")
    text = str(err.value)
    assert "No objective is registered as 'difusion'. Did you mean 'diffusion'?" in text
    assert "Known: block_diffusion, clm, custom, diffusion, mlm." in text
    assert "@stackwise.registry.register_objective('name')" in text
    with pytest.raises(InvalidConfig, match=r"objective.name: .*Did you mean 'mlm'"):
        tiny(objective={"name": "mlmm"})
    with pytest.raises(InvalidConfig, match=r"sample.sampler: .*Did you mean 'remask'"):
        tiny(objective={"name": "mlm"}, sample={"sampler": "remasc"})
    with pytest.raises(InvalidConfig, match=r"masking.schedule: .*Did you mean 'cosine'"):
        tiny(objective={"name": "diffusion"}, masking={"schedule": "cosin"})
    assert from_dict({"sample": {"sampler": "auto"}}).sample.sampler == "auto"


@pytest.mark.parametrize("family", BUILTIN_FAMILIES, ids=lambda f: f.what)
def test_builtins_read_from_their_source_are_what_registers(family):
    """Config validation asks names and capabilities before torch is loaded, from the
    decorator lines; they must be exactly what importing the built-ins registers."""
    importlib.import_module(family.builtins)
    read = read_declarations(source_files(family.builtins), family.decorator.rpartition(".")[2])
    assert read
    builtin = {n for n, e in family.entries.items() if e.__module__.startswith(family.builtins)}
    assert set(read) == builtin
    for name, caps in read.items():
        assert family.capabilities(name) == family.Capabilities(**caps)
        assert family.get(name).name == name


def test_capabilities_are_answered_without_torch():
    code = (
        "import sys\n"
        "from stackwise.config import load_config\n"
        "from stackwise.registry import OBJECTIVES, SAMPLERS\n"
        "cfg = load_config(None, ['objective.name=diffusion'])\n"
        "assert cfg.sample.resolved_sampler('diffusion') == 'ancestral'\n"
        "assert OBJECTIVES.capabilities('diffusion').uses_time and not cfg.objective.causal\n"
        "print(SAMPLERS.names(), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "['ancestral', 'block', 'block_remask', 'confidence', 'remask', 'remdm', "
        "'single_pass'] False"
    )


def test_a_toy_growth_operator_grows_a_run_from_a_config(
    tiny, toys, corpus_file, cache_dir, tmp_path
):
    """progressive.growth_operator names the operator a progressive run starts each stack with."""
    calls: list[int] = []

    @toys(GROWTH_OPERATORS, "toy_copy_trunk")
    def copy_trunk(growth):
        calls.append(len(growth.trunk))
        GROWTH_OPERATORS.get("random")(growth)
        if growth.trunk:
            growth.stack.load_state_dict(growth.trunk[-1].state_dict())

    d = tiny_dict(
        corpus_file,
        cache_dir,
        tmp_path / "grown",
        model={"n_stacks": 2, "blocks_per_stack": 1},
        progressive={
            "strategy": "progressive",
            "steps_per_stack": 2,
            "growth_operator": "toy_copy_trunk",
        },
    )
    d["train"].pop("max_steps")  # the budget is per stack
    res = stackwise.train_from_config(from_dict(d), quiet=True)
    assert calls == [0, 1]  # stack 0 on nothing, stack 1 on the trained stack 0
    assert res.progressive.stacks[1].steps == 2
    with pytest.raises(InvalidConfig, match=r"progressive.growth only applies to strategy"):
        tiny(progressive={"growth_operator": "toy_copy_trunk"})


def test_a_toy_parallelizer_places_a_run_from_a_config(tiny, toys):
    """parallel.strategy names how the model is placed; the step syncs through it."""
    seen = {"placed": 0, "synced": 0}

    @toys(PARALLELIZERS, "toy_place", wraps_model=False)
    class Place:
        def place(self, model, optimizer, accelerator):
            seen["placed"] += 1
            return model.to(accelerator.device), accelerator.prepare(optimizer)

        def sync_gradients(self, raw_model, accelerator):
            seen["synced"] += 1

    res = stackwise.train_from_config(tiny(parallel={"strategy": "toy_place"}), quiet=True)
    assert seen == {"placed": 1, "synced": res.state.step} and res.state.step == 4
    history = res.state.history
    assert history[-1]["loss"] < history[0]["loss"]  # placed by hand, it still learns
    scoped = tiny(
        model={"n_stacks": 2},
        parallel={"strategy": "ddp"},
        progressive={"end_to_end_scope": "stackwise"},
    )
    with pytest.raises(StackWiseError, match="places its model with 'manual'"):
        stackwise.train_from_config(scoped, quiet=True)
