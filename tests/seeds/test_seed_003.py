"""Seed 003 (the progressive training system): each example as the seed writes it, on a tiny
rack and local data, asserting what the seed says it does; import paths are `stackwise`'s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from stackwise import (
    ProgressiveDataLoader,
    ProgressiveRackBuilder,
    ProgressiveTrainer,
    StackWiseConfig,
    TimeStepMasking,
    compute_loss,
    create_stack_from_config,
)
from stackwise.config import from_dict
from stackwise.config.seed_layouts.progressive import LAYOUT
from stackwise.config.seed_view import get_path
from stackwise.data import build_data
from stackwise.errors import StackWiseError
from stackwise.model.time import LearnedTime, SinusoidalTime
from stackwise.objectives import IGNORE, objective_from
from stackwise.plan import compile_plan
from stackwise.runs import load_trained

EXAMPLES = [
    ("config_dual_lora", "training.progressive: qlora_enabled/rank/alpha (stack LoRA) and "
     "progressive_qlora/rank/alpha (trunk adapters)"),
    ("builder", "ProgressiveRackBuilder(config=config, building_mode='append', "
     "default_precision='full'); append_stack x2 (full, half), prepend_stack (qlora); "
     "build_rack()"),
    ("create_stack_from_config", "create_stack_from_config(stack_id=0, n_blocks=4, config=config); "
     "builder.append_stack(n_blocks=4)"),
    ("progressive_dataloader", "TimeStepMasking(config); ProgressiveDataLoader(base_dataloader=, "
     "masking_strategy=, stack_idx=0, trunk_activations=, cache_activations=True)"),
    ("progressive_trainer", "ProgressiveTrainer(config).train_progressively(rack_builder=builder, "
     "dataloader=dataloader, target_stacks=6)"),
    ("time_as_input", "time_interpretation='input', time_embedding_dim=512, "
     "time_encoding_type='sinusoidal'; TimeStepMasking(config)"),
    ("time_as_depth", "time_interpretation='depth', stack_time_mapping='linear', time_per_stack="
     "100; generate_masks_for_stack(batch, stack_idx=2); get_time_step_for_stack(stack_idx=2)"),
    ("strategy_frozen_trunk", "trunk_strategy='frozen', new_stack_precision='full'; "
     "ProgressiveTrainer(config).train_rack(rack_builder, dataloader, target_stacks=6)"),
    ("strategy_qlora_trunk", "trunk_strategy='qlora', new_stack_precision='full', "
     "cache_activations=True; train_rack(...)"),
    ("config_progressive", "the training.progressive YAML reference block"),
    ("progressive_qlora_setup", "qlora_enabled=True, qlora_strategy='progressive'"),
    ("freeze_trunk", "rack_builder.freeze_trunk(trunk_indices)"),
    ("freeze_all_but_qlora", "rack_builder.freeze_all_but_qlora(trunk_indices)"),
    ("trainer_sets_trainable", "the trainer sets what trains from trunk_strategy (frozen: "
     "nothing of the trunk; qlora: only LoRA adapters)"),
    ("qlora_simplified", "qlora_strategy='simplified', qlora_rank=16, qlora_alpha=32"),
    ("qlora_progressive", "qlora_strategy='progressive', qlora_rank_pattern='increasing', "
     "qlora_alpha_pattern='constant'"),
    ("qlora_variable", "qlora_strategy='variable', qlora_configs={0: {rank 8, alpha 16}, ...}"),
    ("example1_basic", "StackWiseConfig.from_yaml('config.yaml'); config.validate(); "
     "ProgressiveRackBuilder(vocab_size=, d_model=, d_ff=, n_heads=); train_progressively"),
    ("example2_qlora_trunk", "trunk_strategy='qlora', cache_activations=True; train_rack"),
    ("example3_time_as_input", "time_interpretation='input', time_encoding_type='learned'; "
     "train_rack"),
    ("example4_objectives", "training_objective = 'mlm' / 'clm' / 'custom'"),
    ("example5_clm_mask", "for batch in progressive_dataloader: combined_masks, clm_mask, "
     "compute_loss(logits, targets, loss_mask)"),
    ("custom_time_mapping", "def custom_time_mapping(stack_idx, max_stacks, num_time_steps)"),
    ("mixed_precision", "rack_builder.append_stack(precision='full' / 'half' / 'qlora')"),
    ("activation_streaming", "ProgressiveDataLoader(..., stack_idx=current_stack, "
     "trunk_activations=cached_activations, cache_activations=True)"),
]  # fmt: skip

DUAL_LORA = """
training:
  progressive:
    # Stack LoRA parameters (added to each stack)
    qlora_enabled: true
    qlora_rank: 16
    qlora_alpha: 32

    # Progressive QLoRA parameters (added to trunk when new stacks are added)
    progressive_qlora: true
    progressive_qlora_rank: 8
    progressive_qlora_alpha: 16
"""

REFERENCE = """
training:
  progressive:
    enabled: true
    trunk_strategy: "frozen"        # "frozen" or "qlora"
    new_stack_precision: "full"    # "full", "half", "bfloat16", "qlora"
    cache_activations: true

    # Simplified QLoRA configuration
    qlora_enabled: true             # Enable QLoRA adapters on all stacks
    qlora_rank: 16                  # QLoRA rank for all stacks
    qlora_alpha: 32                 # QLoRA alpha parameter
    qlora_strategy: "simplified"    # "simplified" - add LoRA to all stacks

    max_stacks: 12
    building_mode: "append"          # "append" or "prepend"

    # Time interpretation
    time_interpretation: "depth"     # "input" or "depth"
    time_embedding_dim: 512        # For time-as-input
    time_encoding_type: "sinusoidal" # "sinusoidal" or "learned"
    stack_time_mapping: "linear"    # "linear", "exponential", "custom"
    time_per_stack: 100            # For time-as-depth
"""

QLORA_CACHE_REFUSED = r"trunk_strategy: frozen .*cannot be cached"


# -- the user's config file and data ----------------------------------------------------------


def write_config(folder: Path, corpus: Path, cache: Path, seed_yaml: str = "", **ours: Any) -> Path:
    """config.yaml: a tiny rack on the local corpus (our sections), plus a seed block."""
    data: dict[str, Any] = {
        "model": {"d_model": 32, "n_heads": 2, "blocks_per_stack": 1, "max_seq_len": 32},
        "data": {
            "source": "files",
            "files": [str(corpus)],
            "seq_len": 32,
            "bpe_vocab_size": 300,
            "cache_dir": str(cache),
            "num_samples": 24,
        },
        "train": {
            "batch_size": 4,
            "lr": 3e-3,
            "eval_every": 1000,
            "eval_batches": 1,
            "mixed_precision": "no",
            "output_dir": str(folder / "run"),
        },
        "logging": {"console": False, "tensorboard": False, "progress_bar": "never"},
        "progressive": {"steps_per_stack": 2},
    }
    for section, values in ours.items():
        data.setdefault(section, {}).update(values)
    seed = yaml.safe_load(seed_yaml) if seed_yaml else {}
    seed.setdefault("training", {}).setdefault("progressive", {}).setdefault("max_stacks", 6)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({**data, **seed}))
    return path


@pytest.fixture
def make_config(tmp_path, corpus_file, cache_dir):
    def make(seed_yaml: str = "", **ours: Any) -> StackWiseConfig:
        return StackWiseConfig.from_yaml(
            write_config(tmp_path, corpus_file, cache_dir, seed_yaml, **ours)
        )

    return make


def loader_of(config: Any, batch_size: int = 4) -> DataLoader:
    data = build_data(compile_plan(config).data)
    return DataLoader(data.train, batch_size=batch_size, shuffle=True)


def state(module: torch.nn.Module, lora: bool | None = None) -> dict[str, torch.Tensor]:
    """A copy of the module's tensors (lora: only adapters; False: only the base)."""
    return {
        k: v.detach().clone()
        for k, v in module.state_dict().items()
        if lora is None or (("lora_" in k) == lora)
    }


def changed(a: dict, b: dict) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


def spy_stages(trainer: Any) -> list[dict[int, dict[str, torch.Tensor]]]:
    """Each stage's start: every stack's tensors, by the stack's id."""
    starts: list[dict[int, dict[str, torch.Tensor]]] = []
    original = type(trainer).train_stage

    def spy(index: int, n: int) -> Any:
        record = original(trainer, index, n)
        return record

    def begin(index: int, n: int) -> Any:
        starts.append({id(s): state(s) for s in trainer.builder.rack.stacks})
        return spy(index, n)

    trainer.train_stage = begin
    return starts


def lora_rank(stack: Any, name: str = "stack") -> int:
    return stack.blocks[0].attn.q_proj.lora_A[name].weight.shape[0]


def lora_scale(stack: Any, name: str = "stack") -> float:
    return stack.blocks[0].attn.q_proj.scaling[name]


# -- the dual-LoRA configuration ---------------------------------------------------------------


def test_config_dual_lora(make_config):
    config = make_config(DUAL_LORA, progressive={"steps_per_stack": 3})
    lo = config.lora
    assert (lo.enabled, lo.rank, lo.alpha) == (True, 16, 32.0)
    assert (lo.trunk_adapters, lo.trunk_rank, lo.trunk_alpha) == (True, 8, 8.0 * 2)
    builder = ProgressiveRackBuilder(config=config)
    trainer = ProgressiveTrainer(config)
    starts = spy_stages(trainer)
    result = trainer.train_progressively(
        rack_builder=builder, dataloader=loader_of(config), target_stacks=2
    )
    first, second = result.rack.stacks
    # stack LoRA on each stack as it was created; the trunk adapter on the trunk only
    assert lora_rank(first) == lora_rank(second) == 16
    assert lora_rank(first, "trunk") == 8 and lora_scale(first, "trunk") == 16 / 8
    assert "trunk" not in second.blocks[0].attn.q_proj.lora_A
    # while stack 1 trained: the frozen trunk's base and its stack LoRA did not move, its
    # trunk adapter did; the new stack trained its weights and its LoRA
    before, now = starts[1][id(first)], state(first)
    assert not changed(before, now)  # base and stack LoRA as stack 0's own stage left them
    made = [k for k in now if k not in before]  # its trunk adapter, made when stack 1 came
    assert made and all(".trunk." in k for k in made)
    assert all(torch.count_nonzero(now[k]) for k in made if "lora_B" in k)  # B starts at 0
    assert all(p.requires_grad for p in second.parameters())  # weights and LoRA train
    assert all(torch.count_nonzero(v) for k, v in state(second).items() if "lora_B" in k)
    trainable = {n for n, p in first.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in first.named_parameters() if ".trunk." in n}


# -- 1. ProgressiveRackBuilder -----------------------------------------------------------------


def test_builder(make_config):
    config = make_config()
    # Create builder (fully config-driven)
    builder = ProgressiveRackBuilder(
        config=config,  # All parameters read from config (including max_stacks)
        building_mode="append",  # or "prepend"
        default_precision="full",
    )

    # Add stacks progressively with dual-LoRA approach
    stack1 = builder.append_stack(n_blocks=4, precision="full")
    stack2 = builder.append_stack(n_blocks=4, precision="half")
    stack3 = builder.prepend_stack(n_blocks=4, precision="qlora")

    # Build final rack
    rack = builder.build_rack()

    assert list(rack.stacks) == [stack3, stack1, stack2]  # prepend goes before the trunk
    assert all(len(s.blocks) == 4 for s in rack.stacks)
    q1, q2, q3 = (s.blocks[0].attn.q_proj for s in (stack1, stack2, stack3))
    assert q1.weight.dtype == torch.float32 and q2.weight.dtype == torch.float16
    assert type(q3.base_layer).__name__ == "Linear4bit" and lora_rank(stack3) == 8  # lora.rank
    assert rack.embed_tokens.weight.shape == (builder.vocab_size, config.model.d_model)
    assert rack.cfg.d_model == config.model.d_model and builder.max_stacks == 6
    ids = torch.randint(0, 100, (2, 16))
    logits = rack(ids, None, torch.full((2,), 0.5))
    assert logits.shape == (2, 16, rack.vocab_size) and torch.isfinite(logits).all()
    for _ in range(3):
        builder.append_stack(n_blocks=1)
    with pytest.raises(StackWiseError, match="max_stacks"):
        builder.append_stack(n_blocks=1)


def test_create_stack_from_config(make_config):
    config = make_config("training: {progressive: {qlora_enabled: true, qlora_rank: 4}}")
    # Create stack using config (no redundant parameters)
    stack = create_stack_from_config(
        stack_id=0,
        n_blocks=4,
        config=config,  # All parameters read from config
    )
    assert len(stack.blocks) == 4 and stack.blocks[0].attn.q_proj.in_features == 32
    assert lora_rank(stack) == 4  # its LoRA, as the config gives stack 0

    builder = ProgressiveRackBuilder(config=config)
    # Or use the builder (recommended)
    stack = builder.append_stack(n_blocks=4)  # Uses config internally
    assert len(stack.blocks) == 4 and lora_rank(stack) == 4
    assert builder.meta[stack].precision == config.progressive.new_stack_precision == "full"


# -- 2. ProgressiveDataLoader -------------------------------------------------------------------


def test_progressive_dataloader(make_config):
    config = make_config()
    dataloader = loader_of(config)
    builder = ProgressiveRackBuilder(config=config)
    cached_activations = builder.cached_activations()
    # Create masking strategy
    masking_strategy = TimeStepMasking(config)

    # Create progressive dataloader
    progressive_dataloader = ProgressiveDataLoader(
        base_dataloader=dataloader,
        masking_strategy=masking_strategy,
        stack_idx=0,
        trunk_activations=cached_activations,
        cache_activations=True,
    )
    first = list(progressive_dataloader)
    n = len(dataloader.dataset)
    assert cached_activations.stats["misses"] == n and cached_activations.stats["hits"] == 0
    second = list(progressive_dataloader)
    assert cached_activations.stats["hits"] == n  # the second pass reads the cache
    batch = first[0]
    for key in ("inputs", "targets", "masks", "combined_masks", "t", "trunk_activations"):
        assert key in batch, key
    assert batch["training_objective"] == "mlm" and batch["stack_idx"] == 0
    assert batch["trunk_activations"].shape == (4, 32, 32)
    by_key = {
        int(k): a
        for b in first
        for k, a in zip(b["cache_key"], b["trunk_activations"], strict=True)
    }
    for b in second:  # the same sample, the same masks and activations on every pass
        for k, a in zip(b["cache_key"], b["trunk_activations"], strict=True):
            assert torch.equal(by_key[int(k)], a)


# -- 3. ProgressiveTrainer ----------------------------------------------------------------------


def test_progressive_trainer(make_config):
    config = make_config(
        "training: {progressive: {cache_activations: true}}", progressive={"steps_per_stack": 1}
    )
    dataloader = loader_of(config)
    builder = ProgressiveRackBuilder(
        config=config, building_mode="append", default_precision="full"
    )
    # Create trainer
    trainer = ProgressiveTrainer(config)

    # Train progressively
    results = trainer.train_progressively(
        rack_builder=builder, dataloader=dataloader, target_stacks=6
    )
    assert [r.index for r in results.stacks] == [0, 1, 2, 3, 4, 5]
    assert results.rack is builder.build_rack() and len(builder.rack.stacks) == 6
    assert all(r.steps == 1 and r.train_loss is not None for r in results.stacks)
    # the activation cache served the frozen trunk from stack 1 on
    later = [r.cache for r in results.stacks[1:]]
    assert all(c["hits"] + c["misses"] == 4 for c in later)
    assert sum(c["hits"] for c in later) > 0
    plan, rack, _ = load_trained(results.output_dir)
    assert len(rack.stacks) == 6 and plan.model.n_stacks == 6


# -- time interpretation --------------------------------------------------------------------


def test_time_as_input(make_config):
    config = make_config(masking={"num_time_steps": 50})
    # Configuration
    config.training.progressive.time_interpretation = "input"
    config.training.progressive.time_embedding_dim = 512
    config.training.progressive.time_encoding_type = "sinusoidal"  # or "learned"

    # Usage - time is automatically sampled per batch
    masking_strategy = TimeStepMasking(config)
    # Time is randomly sampled from uniform [0, 1] for each batch
    # and converted to discrete time steps (0 to num_time_steps-1)

    assert config.model.time_embedding_dim == 512 and config.model.time_conditioning == "sinusoidal"
    rack = ProgressiveRackBuilder(config=config).build_rack()
    assert isinstance(rack.time_embed, SinusoidalTime)
    assert rack.time_embed.mlp[0].in_features == 512  # 512 sinusoidal features of t
    batches = [masking_strategy.generate_masks(b) for b in loader_of(config)]
    for b in batches:
        assert len(set(b["time_steps"].tolist())) == 1  # one time step per batch
        step = int(b["time_steps"][0])
        assert 0 <= step < 50 and b["t"][0] == pytest.approx((step + 1) / 50)
    steps = {int(b["time_steps"][0]) for b in batches}
    assert len(steps) > 2  # drawn anew for each batch
    fraction = torch.stack([b["masks"].float().mean() for b in batches])
    t = torch.stack([b["t"][0] for b in batches])
    assert torch.corrcoef(torch.stack([fraction, t]))[0, 1] > 0.8  # the mask follows t


def test_time_as_depth(make_config):
    config = make_config(
        "training: {progressive: {max_stacks: 4}}",
        progressive={"head_policy": "always"},
    )
    batch = next(iter(loader_of(config)))
    # Configuration
    config.training.progressive.time_interpretation = "depth"
    config.training.progressive.stack_time_mapping = "linear"  # or "exponential"
    config.training.progressive.time_per_stack = 100

    # Usage
    masking_strategy = TimeStepMasking(config)
    masks = masking_strategy.generate_masks_for_stack(batch, stack_idx=2)
    time_step = masking_strategy.get_time_step_for_stack(stack_idx=2)

    assert masking_strategy.num_time_steps == 400  # time_per_stack x max_stacks
    assert time_step == 200
    assert all(200 <= s < 300 for s in masks["time_steps"].tolist())
    assert [masking_strategy.get_time_step_for_stack(k) for k in range(4)] == [0, 100, 200, 300]
    assert masks["masks"].float().mean() > 0.3  # t in (0.5, 0.75]: most tokens masked


# -- training strategies --------------------------------------------------------------------


def test_strategy_frozen_trunk(make_config):
    config = make_config(progressive={"steps_per_stack": 1})
    rack_builder = ProgressiveRackBuilder(config=config)
    dataloader = loader_of(config)
    config.training.progressive.trunk_strategy = "frozen"
    config.training.progressive.new_stack_precision = "full"

    # Previous stacks are frozen, only new stack is trained
    trainer = ProgressiveTrainer(config)
    starts = spy_stages(trainer)
    results = trainer.train_rack(rack_builder, dataloader, target_stacks=6)

    stacks = list(results.rack.stacks)
    assert len(stacks) == len(results.stacks) == 6
    for k, stack in enumerate(stacks[:-1]):
        trained = starts[k + 1][id(stack)]  # as its own stage left it
        assert not changed(trained, state(stack)), k  # frozen ever after
    assert not any(p.requires_grad for s in stacks[:-1] for p in s.parameters())


def test_strategy_qlora_trunk(make_config):
    config = make_config()
    config.training.progressive.trunk_strategy = "qlora"
    config.training.progressive.new_stack_precision = "full"
    config.training.progressive.cache_activations = True

    with pytest.raises(StackWiseError, match=QLORA_CACHE_REFUSED) as err:
        ProgressiveTrainer(config).train_rack(
            ProgressiveRackBuilder(config=make_config()), loader_of(config), target_stacks=6
        )
    assert "\n" not in str(err.value)


# -- configuration ---------------------------------------------------------------------------


def test_config_progressive(make_config):
    config = make_config(REFERENCE)
    p, lo, m = config.progressive, config.lora, config.model
    assert (p.strategy, p.trunk_strategy, p.new_stack_precision) == (
        "progressive",
        "frozen",
        "full",
    )
    assert p.cache.enabled and (lo.enabled, lo.rank, lo.alpha, lo.strategy) == (
        True,
        16,
        32.0,
        "simplified",
    )
    assert (m.n_stacks, p.building_mode, p.time_interpretation) == (12, "append", "depth")
    assert (m.time_embedding_dim, m.time_conditioning) == (512, "sinusoidal")
    assert (p.depth_mapping, p.time_per_stack, config.masking.num_time_steps) == (
        "linear",
        100,
        1200,
    )
    assert config.objective.name == "diffusion"  # the seed's default objective, masked by time
    plan = compile_plan(config, train_rows=24)
    assert len(plan.stages) == 12
    assert [s.adapter.rank for s in plan.stages] == [16] * 12  # stack LoRA on every stack
    assert plan.stages[3].t_range == pytest.approx((300 / 1200, 400 / 1200))


def test_progressive_qlora_setup(make_config):
    config = make_config()
    # QLoRA adapters are added to each stack during creation
    # with stack-specific configurations
    config.training.progressive.qlora_enabled = True
    config.training.progressive.qlora_strategy = "progressive"  # or "simplified", "variable"
    config.training.progressive.qlora_rank_pattern = "increasing"
    config.validate()
    builder = ProgressiveRackBuilder(config=config)
    stacks = [builder.append_stack() for _ in range(3)]
    assert [lora_rank(s) for s in stacks] == [8, 16, 32]  # lora.rank 8 doubling per stack


def _three_stacks(make_config, seed_yaml: str = "") -> tuple[Any, Any]:
    config = make_config(seed_yaml or "training: {progressive: {qlora_enabled: true}}")
    rack_builder = ProgressiveRackBuilder(config=config)
    for _ in range(3):
        rack_builder.append_stack()
    return config, rack_builder


def _grads(rack_builder: Any) -> set[str]:
    """Names of the parameters that get a gradient from one backward pass."""
    rack = rack_builder.build_rack()
    for p in rack.parameters():
        p.grad = None
    ids = torch.randint(0, 100, (2, 16))
    rack(ids).float().sum().backward()
    return {n for n, p in rack.named_parameters() if p.grad is not None}


def test_freeze_trunk(make_config):
    _, rack_builder = _three_stacks(make_config)
    trunk_indices = rack_builder.trunk_indices
    assert trunk_indices == [0, 1]
    # When trunk is frozen: ALL parameters (including LoRA) are frozen
    rack_builder.freeze_trunk(trunk_indices)
    # Result: No training on trunk stacks
    grads = _grads(rack_builder)
    assert not any(n.startswith(("stacks.0.", "stacks.1.")) for n in grads)
    assert {n for n in grads if n.startswith("stacks.2.")} == {
        n for n, _ in rack_builder.rack.named_parameters() if n.startswith("stacks.2.")
    }


def test_freeze_all_but_qlora(make_config):
    _, rack_builder = _three_stacks(make_config)
    trunk_indices = rack_builder.trunk_indices
    # When QLoRA trunk: only LoRA adapters are trainable
    rack_builder.freeze_all_but_qlora(trunk_indices)
    # Result: Only LoRA adapters are updated, original params frozen
    grads = _grads(rack_builder)
    trunk = {n for n in grads if n.startswith(("stacks.0.", "stacks.1."))}
    assert trunk and all("lora_" in n for n in trunk)
    names = [n for n, _ in rack_builder.rack.named_parameters()]
    assert trunk == {n for n in names if n.startswith(("stacks.0.", "stacks.1.")) and "lora_" in n}
    assert "stacks.2.blocks.0.attn.q_proj.base_layer.weight" in grads  # the new stack trains


@pytest.mark.parametrize("trunk_strategy", ["frozen", "qlora"])
def test_trainer_sets_trainable(make_config, trunk_strategy):
    config = make_config(
        f"training: {{progressive: {{qlora_enabled: true, trunk_strategy: {trunk_strategy}}}}}",
        progressive={"steps_per_stack": 2},
    )
    trainer = ProgressiveTrainer(config)
    starts = spy_stages(trainer)
    result = trainer.train_progressively(
        rack_builder=ProgressiveRackBuilder(config=config),
        dataloader=loader_of(config),
        target_stacks=2,
    )
    trunk = result.rack.stacks[0]
    trainable = {n for n, p in trunk.named_parameters() if p.requires_grad}
    moved = changed(starts[1][id(trunk)], state(trunk))
    if trunk_strategy == "frozen":  # All parameters (including LoRA) are frozen
        assert not trainable and not moved
    else:  # Only LoRA adapters are trainable (the trunk stored as nf4 under them)
        assert trainable and all("lora_" in n for n in trainable)
        lora = [k for k in moved if "lora_" in k]
        assert lora and len(lora) == len([k for k in state(trunk) if "lora_B" in k]) * 2
        assert type(trunk.blocks[0].attn.q_proj.base_layer).__name__ == "Linear4bit"
        norms = {k: v for k, v in state(trunk).items() if "norm" in k}
        assert not changed(norms, {k: starts[1][id(trunk)][k] for k in norms})


# -- QLoRA strategies --------------------------------------------------------------------------


def _ranks(config: Any, n: int = 4) -> list[tuple[int, float]]:
    config.validate()
    builder = ProgressiveRackBuilder(config=config)
    stacks = [builder.append_stack() for _ in range(n)]
    return [(lora_rank(s), lora_scale(s)) for s in stacks]


def test_qlora_simplified(make_config):
    config = make_config("training: {progressive: {qlora_enabled: true}}")
    # All stacks get the same QLoRA configuration
    config.training.progressive.qlora_strategy = "simplified"
    config.training.progressive.qlora_rank = 16
    config.training.progressive.qlora_alpha = 32
    assert _ranks(config) == [(16, 2.0)] * 4


def test_qlora_progressive(make_config):
    config = make_config(
        "training: {progressive: {qlora_enabled: true, qlora_rank: 16, qlora_alpha: 32}}"
    )
    # QLoRA parameters change as stacks are added
    config.training.progressive.qlora_strategy = "progressive"
    config.training.progressive.qlora_rank_pattern = "increasing"  # 16, 32, 64, 128...
    config.training.progressive.qlora_alpha_pattern = "constant"  # 32, 32, 32, 32...
    assert [r for r, _ in _ranks(config)] == [16, 32, 64, 128]
    assert [r * s for r, s in _ranks(config)] == [32.0] * 4  # alpha = rank x scale


def test_qlora_variable(make_config):
    config = make_config("training: {progressive: {qlora_enabled: true, max_stacks: 4}}")
    # Custom QLoRA configuration per stack
    config.training.progressive.qlora_strategy = "variable"
    config.training.progressive.qlora_configs = {
        0: {"rank": 8, "alpha": 16},  # Stack 0: small QLoRA
        1: {"rank": 16, "alpha": 32},  # Stack 1: medium QLoRA
        2: {"rank": 32, "alpha": 64},  # Stack 2: large QLoRA
        3: {"rank": 64, "alpha": 128},  # Stack 3: very large QLoRA
    }
    assert _ranks(config) == [(8, 2.0), (16, 2.0), (32, 2.0), (64, 2.0)]


# -- usage examples ------------------------------------------------------------------------------


def test_example1_basic(tmp_path, corpus_file, cache_dir, monkeypatch):
    write_config(tmp_path, corpus_file, cache_dir, "", model={"vocab_size": 320, "ffn_hidden": 48})
    monkeypatch.chdir(tmp_path)
    # Load configuration
    config = StackWiseConfig.from_yaml("config.yaml")
    config.validate()

    # Create components
    rack_builder = ProgressiveRackBuilder(
        vocab_size=config.model.vocab_size,
        d_model=config.model.d_model,
        d_ff=config.model.d_ff,
        n_heads=config.model.n_heads,
    )

    trainer = ProgressiveTrainer(config)
    dataloader = loader_of(config)

    # Train progressively
    results = trainer.train_progressively(
        rack_builder=rack_builder, dataloader=dataloader, target_stacks=6
    )
    assert len(results.stacks) == 6 and results.rack is rack_builder.build_rack()
    ffn = results.rack.stacks[0].blocks[0].ffn
    assert ffn.gate_proj.out_features == 48 and results.rack.vocab_size == 320
    assert all(r.train_loss == r.train_loss for r in results.stacks)  # finite, trained
    bad = ProgressiveRackBuilder(vocab_size=320, d_model=64, d_ff=48, n_heads=2)
    with pytest.raises(StackWiseError, match=r"d_model=64 \(the config has 32\)"):
        ProgressiveTrainer(config).train_progressively(rack_builder=bad, dataloader=dataloader)


def test_example2_qlora_trunk(make_config):
    config = make_config("training: {progressive: {qlora_enabled: true}}")
    rack_builder, dataloader = ProgressiveRackBuilder(config=config), loader_of(config)
    # Configure for QLoRA trunk
    config.training.progressive.trunk_strategy = "qlora"
    config.training.progressive.cache_activations = True

    # Train with QLoRA trunk
    trainer = ProgressiveTrainer(config)
    with pytest.raises(StackWiseError, match=QLORA_CACHE_REFUSED):
        trainer.train_rack(rack_builder, dataloader, target_stacks=6)


def test_example3_time_as_input(make_config):
    config = make_config(masking={"num_time_steps": 10}, progressive={"steps_per_stack": 1})
    rack_builder, dataloader = ProgressiveRackBuilder(config=config), loader_of(config)
    # Configure for time-as-input
    config.training.progressive.time_interpretation = "input"
    config.training.progressive.time_encoding_type = "learned"

    # Train with time-as-input
    trainer = ProgressiveTrainer(config)
    seen: list[Any] = []
    original = LearnedTime.forward

    def spy(self: Any, t: torch.Tensor) -> torch.Tensor:
        seen.append(t.detach().clone())
        return original(self, t)

    LearnedTime.forward = spy  # type: ignore[method-assign]
    try:
        results = trainer.train_rack(rack_builder, dataloader, target_stacks=6)
    finally:
        LearnedTime.forward = original  # type: ignore[method-assign]
    assert isinstance(results.rack.time_embed, LearnedTime)
    assert results.rack.time_embed.table.num_embeddings == 10  # one row per time step
    assert seen and all(((t * 10) - (t * 10).round()).abs().max() < 1e-5 for t in seen)


def test_example4_objectives(make_config, tmp_path):
    config = make_config()
    batch = next(iter(loader_of(config)))
    ids = batch["input_ids"]
    # MLM objective (default)
    config.training.progressive.training_objective = "mlm"
    # Targets are automatically determined from inputs and masks
    mlm = TimeStepMasking(config).generate_masks(batch)
    assert config.objective.name == "diffusion"
    assert torch.equal(mlm["targets"][mlm["masks"]], ids[mlm["masks"]])
    assert (mlm["targets"][~mlm["masks"]] == IGNORE).all()

    # CLM objective
    config.training.progressive.training_objective = "clm"
    # Targets are shifted inputs for next token prediction
    # WARNING: Last target token may not be available!
    clm = TimeStepMasking(config).generate_masks(batch)
    assert torch.equal(clm["targets"][:, :-1], ids[:, 1:]) and (clm["targets"][:, -1] == -100).all()

    # Custom objective
    config.training.progressive.training_objective = "custom"
    # Targets must be provided in the batch
    targets = torch.roll(ids, 1, dims=1)
    custom = TimeStepMasking(config).generate_masks({**batch, "targets": targets})
    assert torch.equal(custom["targets"], targets) and torch.equal(custom["inputs"], ids)

    # custom from Python: a dataset that yields targets trains
    rows = [{"input_ids": r["input_ids"], "targets": torch.roll(r["input_ids"], 1)} for r in
            loader_of(config).dataset]  # fmt: skip
    config.training.progressive.trunk_strategy = "frozen"
    result = ProgressiveTrainer(config).train_rack(
        ProgressiveRackBuilder(config=config), DataLoader(rows, batch_size=4), target_stacks=2
    )
    assert all(r.train_loss is not None for r in result.stacks)
    # custom from a file alone: refused in one paragraph (the pretraining data has no targets)
    path = tmp_path / "custom.yaml"
    path.write_text((tmp_path / "config.yaml").read_text() + "\n")
    data = yaml.safe_load(path.read_text())
    data["training"]["progressive"]["training_objective"] = "custom"
    path.write_text(yaml.safe_dump(data))
    run = subprocess.run(
        [sys.executable, "-m", "stackwise", "train", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "reads labels from the batch" in run.stderr and "ProgressiveTrainer" in run.stderr


def test_example5_clm_mask(make_config):
    config = make_config("training: {progressive: {training_objective: clm}}")
    builder = ProgressiveRackBuilder(config=config)
    builder.append_stack()
    model = builder.build_rack()
    progressive_dataloader = ProgressiveDataLoader(loader_of(config), TimeStepMasking(config))
    objective = objective_from(
        compile_plan(config).objective, compile_plan(config).masking, model_specials(config)
    )
    losses = []
    # For CLM, use the provided CLM mask to exclude last position
    for batch in progressive_dataloader:
        if batch["training_objective"] == "clm":
            # Use combined_masks which excludes the last position
            loss_mask = batch["combined_masks"]
            # Or use clm_mask for all positions except last
            clm_mask = batch["clm_mask"]

            logits, targets = model(batch["inputs"]), batch["targets"]
            # Compute loss only on valid positions
            loss = compute_loss(logits, targets, loss_mask)

            assert not clm_mask[:, -1].any() and clm_mask[:, :-1].all()
            assert not (loss_mask & ~clm_mask).any()
            prep = objective.prepare({"input_ids": batch["input_ids"]}, torch.Generator())
            torch.testing.assert_close(loss, objective.loss(logits, prep))
            losses.append(loss)
    assert losses


def model_specials(config: Any) -> Any:
    from stackwise.data.blocks import specials_of

    return specials_of(build_data(compile_plan(config).data).tokenizer)


def test_custom_time_mapping(make_config):
    config = make_config(
        "training: {progressive: {max_stacks: 3, time_interpretation: depth, "
        "stack_time_mapping: custom}}",
        masking={"num_time_steps": 100},
        progressive={"steps_per_stack": 1, "head_policy": "always"},
    )

    # Custom time mapping for time-as-depth
    def custom_time_mapping(stack_idx, max_stacks, num_time_steps):
        # Custom logic here
        return min(stack_idx * 50, num_time_steps - 1)

    masking = TimeStepMasking(config, time_mapping=custom_time_mapping)
    assert [masking.get_time_step_for_stack(k) for k in range(3)] == [0, 50, 99]
    trainer = ProgressiveTrainer(config, time_mapping=custom_time_mapping)
    result = trainer.train_rack(ProgressiveRackBuilder(config=config), loader_of(config))
    assert [r.t_range for r in result.stacks] == [(0.01, 0.01), (0.51, 0.51), (1.0, 1.0)]
    with pytest.raises(StackWiseError, match="function given in Python"):
        TimeStepMasking(config).get_time_step_for_stack(1)


def test_mixed_precision(make_config):
    config = make_config()
    rack_builder = ProgressiveRackBuilder(config=config)
    # Different precision for different stacks
    rack_builder.append_stack(precision="full")  # First stack
    rack_builder.append_stack(precision="half")  # Second stack
    rack_builder.append_stack(precision="qlora")  # Third stack

    full, half, qlora = rack_builder.build_rack().stacks
    assert full.blocks[0].ffn.up_proj.weight.dtype == torch.float32
    assert all(p.dtype == torch.float16 for p in half.parameters())
    linear4 = qlora.blocks[0].ffn.up_proj.base_layer
    assert type(linear4).__name__ == "Linear4bit" and linear4.weight.dtype == torch.uint8
    assert [rack_builder.meta[s].storage for s in (full, half, qlora)] == ["full", "fp16", "nf4"]
    logits = rack_builder.build_rack()(torch.randint(0, 100, (2, 8)), None, torch.full((2,), 0.5))
    assert torch.isfinite(logits).all()


def test_activation_streaming(make_config):
    config = make_config()
    dataloader = loader_of(config)
    masking_strategy = TimeStepMasking(config)
    builder = ProgressiveRackBuilder(config=config)
    trunk = [builder.append_stack(), builder.append_stack()]
    current_stack = 2
    calls = [0]
    for stack in trunk:
        stack.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    cached_activations = builder.cached_activations()

    # Stream activations through trunk
    progressive_dataloader = ProgressiveDataLoader(
        base_dataloader=dataloader,
        masking_strategy=masking_strategy,
        stack_idx=current_stack,
        trunk_activations=cached_activations,
        cache_activations=True,
    )
    first = list(progressive_dataloader)
    assert calls[0] == 2 * len(first) and cached_activations.stats["misses"] == 24
    second = list(progressive_dataloader)
    assert calls[0] == 2 * len(first), "a hit must not run the trunk"
    assert cached_activations.stats["hits"] == 24
    b = second[0]
    with torch.no_grad():  # the cached states are the trunk's output (bf16 copies)
        fresh = builder.rack.run_stacks(builder.rack.embed(b["inputs"], b["t"]), None, trunk)
    torch.testing.assert_close(b["trunk_activations"], fresh, rtol=2e-2, atol=2e-2)


# -- the layout table --------------------------------------------------------------------------

P = "training.progressive."
LORA = {f"{P}qlora_enabled": True}
DEPTH = {f"{P}time_interpretation": "depth"}
VALUES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    # seed path: (value as the seed writes it, our value, other seed keys it needs)
    f"{P}enabled": (False, "end_to_end", {}),
    f"{P}trunk_strategy": ("qlora", "qlora", LORA),
    f"{P}new_stack_precision": ("half", "fp16", {}),
    f"{P}cache_activations": (True, True, {}),
    f"{P}qlora_enabled": (True, True, {}),
    f"{P}qlora_rank": (16, 16, LORA),
    f"{P}qlora_alpha": (32, 32.0, LORA),
    f"{P}qlora_strategy": ("progressive", "progressive", LORA),
    f"{P}qlora_rank_pattern": (
        "increasing", "increasing", {**LORA, f"{P}qlora_strategy": "progressive"}
    ),
    f"{P}qlora_alpha_pattern": ("linear", "linear", {**LORA, f"{P}qlora_strategy": "progressive"}),
    f"{P}qlora_configs": (
        {0: {"rank": 4}}, {0: {"rank": 4, "alpha": None}},
        {**LORA, f"{P}qlora_strategy": "variable"},
    ),
    f"{P}progressive_qlora": (True, True, LORA),
    f"{P}progressive_qlora_rank": (8, 8, {**LORA, f"{P}progressive_qlora": True}),
    f"{P}progressive_qlora_alpha": (16, 16.0, {**LORA, f"{P}progressive_qlora": True}),
    f"{P}max_stacks": (5, 5, {}),
    f"{P}building_mode": ("prepend", "prepend", {}),
    f"{P}time_interpretation": ("depth", "depth", {}),
    f"{P}time_embedding_dim": (64, 64, {f"{P}time_encoding_type": "sinusoidal"}),
    f"{P}time_encoding_type": ("sinusoidal", "sinusoidal", {}),
    f"{P}stack_time_mapping": ("exponential", "exponential", DEPTH),
    f"{P}time_per_stack": (10, 10, DEPTH),
    f"{P}training_objective": ("clm", "clm", {}),
    "model.d_ff": (48, 48, {}),
}  # fmt: skip


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *where, leaf = path.split(".")
        node = out
        for part in where:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("path", sorted(LAYOUT.keys))
def test_every_layout_key_lands_on_its_real_key(path):
    assert set(VALUES) == set(LAYOUT.keys)
    value, ours, needs = VALUES[path]
    target = LAYOUT.keys[path].target
    config = from_dict(_nested({**needs, path: value}))
    assert _plain(get_path(config, target)) == ours
    plain = from_dict(_nested({f"{P}building_mode": "append"}))  # the seed's defaults
    assert _plain(get_path(plain, target)) != ours  # the key changed it
