"""Seed 000 (the unified training module): each example as the seed writes it, on tiny layers
and a local DataLoader, asserting what the seed says it does; import paths are `stackwise`'s."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import stackwise
from stackwise import ProgressiveConfig, TrainingConfig, UnifiedTrainer
from stackwise.config.seed_layouts.unified import LAYOUT
from stackwise.config.seed_view import get_path
from stackwise.errors import StackWiseError
from stackwise.fronts.unified_data import vocabulary
from stackwise.io.stack_files import rack_from_stacks
from stackwise.objectives import Diffusion, objective_from
from stackwise.quant.layers import FP8Linear, weight_bytes
from stackwise.train.extensions import EXTENSIONS, Extension, register_extension
from stackwise.train.hardware import resolve_precision

ROOT = Path(__file__).parents[2]

EXAMPLES = [
    ("quick_start", "TrainingConfig(mode='blockwise', block_size=4, time_step_masking=True, "
     "quantization_enabled=True, qlora_enabled=True); UnifiedTrainer(config); "
     "trainer.train_all_layers(dataloader, model_layers)"),
    ("progressive_training", "TrainingConfig(strategy='progressive', progressive="
     "ProgressiveConfig(target_stacks=8, trunk_strategy='frozen', new_stack_precision='full'))"),
    ("end_to_end_stackwise", "TrainingConfig(strategy='end_to_end', end_to_end_scope="
     "'stackwise', time_step_masking=False)"),
    ("end_to_end_rackwise", "TrainingConfig(strategy='end_to_end', end_to_end_scope='rackwise', "
     "time_step_masking=True, quantization_enabled=True, qlora_enabled=True)"),
    ("time_step_masking", "TrainingConfig(time_step_masking=True, num_time_steps=10, "
     "time_step_bins=[0..9], time_step_mask_fractions={0: .15, 5: .5, 9: .9}, "
     "store_all_time_steps=False, time_step_cache_size=1)"),
    ("quantization_qlora", "TrainingConfig(quantization_enabled=True, quantization_type="
     "'nf_fp8' (or fp16, fp32), mixed_precision=True, backbone_quantized=True, "
     "adapters_full_precision=True, qlora_enabled=True, qlora_rank=16, qlora_alpha=32)"),
    ("configuration_options", "the option lists: strategy, end_to_end_scope, progressive; the "
     "time-step keys; the quantization keys; qlora.*; cache_mode, cache_dir, save_stacks, "
     "save_rack"),
    ("architecture", "the module tree: unified trainer, block trainer, fusion trainer, masking / "
     "quantization / caching strategies"),
    ("example_script", "examples/unified_trainer_example.py"),
]  # fmt: skip

PERIOD = 12


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Layers this small train fastest on one thread (and do not fight a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pattern_rows(n: int = 192, length: int = 24, seed: int = 0) -> torch.Tensor:
    """Rows of one repeating pattern at random shifts: learnable from either direction."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.arange(length) % PERIOD
    shifts = torch.randint(0, PERIOD, (n,), generator=gen)
    return torch.stack([torch.roll(base, int(s)) for s in shifts])


def loader(n: int = 192, batch_size: int = 16) -> DataLoader:
    return DataLoader([{"input_ids": r} for r in pattern_rows(n)], batch_size=batch_size)


dataloader = loader()


def shrink(config: Any, tmp_path: Path, steps: int = 4, lr: float = 3e-3, fp32: bool = True) -> Any:
    """A seed's config made seconds-long on a CPU: tiny layers, few steps, quiet, in tmp_path
    (in fp32 unless `fp32` is false: the seed's mixed_precision then stands)."""
    config.model.d_model, config.model.n_heads = 32, 2
    config.train.max_steps, config.train.batch_size, config.train.lr = steps, 8, lr
    config.train.eval_every, config.train.eval_batches = 1000, 1
    config.train.output_dir = str(tmp_path / "run")
    if fp32:
        config.train.mixed_precision = "no"
    config.logging.console = config.logging.tensorboard = False
    config.logging.progress_bar = "never"
    return config


def fell(losses: list[float], k: int = 6) -> bool:
    return statistics.mean(losses[-k:]) < statistics.mean(losses[:k])


def snapshot(layers: list[Any]) -> list[dict[str, torch.Tensor]]:
    return [{k: v.detach().clone() for k, v in b.state_dict().items()} for b in layers]


def one_paragraph(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def base_of(linear: Any) -> Any:
    return getattr(linear, "base_layer", linear)


# -- the quick start: blockwise growth of the layers given ------------------------------------


def test_quick_start(tmp_path):
    config = TrainingConfig(
        mode="blockwise",
        block_size=4,
        time_step_masking=True,
        quantization_enabled=True,
        qlora_enabled=True,
    )
    shrink(config, tmp_path, steps=48)
    trainer = UnifiedTrainer(config)
    model_layers = trainer.new_layers()  # 2 stacks x block_size 4
    before = snapshot(model_layers)

    trainer.train_all_layers(dataloader, model_layers)

    result = trainer.result
    p = result.plan
    assert (p.progressive.strategy, p.progressive.mode, p.model.blocks_per_stack) == (
        "progressive",
        "blockwise",
        4,
    )
    assert (p.objective.name, p.masking.num_time_steps) == ("diffusion", 10)  # time steps
    assert [s.layers for s in result.stages] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for stage in result.stages:  # each group trained, its loss fell
        assert len(stage.losses) == 24 and fell(stage.losses), stage
    in_rack = [b for stack in result.rack.stacks for b in stack.blocks]
    assert all(a is b for a, b in zip(in_rack, model_layers, strict=True))  # the very layers
    for layer, old in zip(model_layers, before, strict=True):
        assert not torch.equal(layer.attn_norm.weight.detach(), old["attn_norm.weight"])
    # the earlier group: stored NF4 (quantization), its QLoRA adapters still training
    trunk, new = model_layers[0].attn.q_proj, model_layers[4].attn.q_proj
    assert (
        type(base_of(trunk)).__name__ == "Linear4bit"
        and not base_of(trunk).weight.is_floating_point()
    )
    assert type(base_of(new)) is torch.nn.Linear and base_of(new).weight.requires_grad
    assert trunk.lora_A["stack"].weight.requires_grad  # trunk_strategy qlora: adapters train
    assert p.progressive.trunk_strategy == "qlora"


# -- progressive training: 8 stacks over a frozen trunk ---------------------------------------


@pytest.fixture
def trunk_watch():
    """An extension that checks, stage by stage, that the trunk neither trains nor changes."""
    seen: list[tuple[int, bool]] = []

    @register_extension("seed000_trunk_watch")
    class TrunkWatch(Extension):
        def on_train_begin(self, run):
            model = run.model
            self.trunk = [s for s in model.rack.stacks if s is not model.new_stack]
            self.before = [snapshot([s])[0] for s in self.trunk]
            self.frozen = not any(p.requires_grad for s in self.trunk for p in s.parameters())

        def on_stack_end(self, run, index, record):
            same = all(
                all(torch.equal(v, s.state_dict()[k]) for k, v in old.items())
                for s, old in zip(self.trunk, self.before, strict=True)
            )
            seen.append((len(self.trunk), self.frozen and same))

    yield seen
    EXTENSIONS.entries.pop("seed000_trunk_watch", None)


def test_progressive_training(tmp_path, trunk_watch):
    config = TrainingConfig(
        strategy="progressive",
        progressive=ProgressiveConfig(
            target_stacks=8,
            trunk_strategy="frozen",
            new_stack_precision="full",
        ),
    )
    assert config.model.n_stacks == 8
    shrink(config, tmp_path, steps=16)
    config.model.blocks_per_stack = 1
    config.train.enabled_extensions = ["seed000_trunk_watch"]
    result = UnifiedTrainer(config).train_all_layers(dataloader)
    assert len(result.rack.stacks) == 8 and len(result.progressive.stacks) == 8
    assert trunk_watch == [(i, True) for i in range(8)]  # stage i: i frozen, unchanged stacks
    assert all(len(s.losses) == 2 for s in result.stages)
    saved = sorted(p.name for p in (result.output_dir / "stacks").glob("stack_*.safetensors"))
    assert len(saved) == 8


# -- end to end: stackwise (a loss per stack) and rackwise QLoRA ------------------------------


def test_end_to_end_stackwise(tmp_path):
    config = TrainingConfig(
        strategy="end_to_end",
        end_to_end_scope="stackwise",
        time_step_masking=False,
    )
    shrink(config, tmp_path, steps=24)
    trainer = UnifiedTrainer(config)
    layers = trainer.new_layers()
    before = snapshot(layers)
    result = trainer.train_all_layers(dataloader, layers)
    assert isinstance(result.runner.strategy, stackwise.strategies.LocalLossStrategy)
    assert result.plan.masking.num_time_steps is None and result.plan.objective.name == "clm"
    assert len(result.rack.stacks) == 2 and fell(result.stages[0].losses)
    for layer, old in zip(layers, before, strict=True):  # every stack trained, all at once
        assert not torch.equal(layer.attn.q_proj.weight.detach(), old["attn.q_proj.weight"])


def test_end_to_end_rackwise(tmp_path):
    config = TrainingConfig(
        strategy="end_to_end",
        end_to_end_scope="rackwise",
        time_step_masking=True,
        quantization_enabled=True,
        qlora_enabled=True,
    )
    shrink(config, tmp_path, steps=30, lr=1e-2)
    trainer = UnifiedTrainer(config)
    layers = trainer.new_layers()
    result = trainer.train_all_layers(dataloader, layers)
    assert result.plan.objective.name == "diffusion" and fell(result.stages[0].losses)
    for layer in layers:  # every stack: an NF4 base, frozen, under a trained adapter
        q = layer.attn.q_proj
        assert type(base_of(q)).__name__ == "Linear4bit" and not base_of(q).weight.requires_grad
        assert q.lora_B["stack"].weight.requires_grad and q.lora_B["stack"].weight.abs().sum() > 0
    assert result.rack.embed_tokens.weight.requires_grad  # the anchor trains
    # the saved run is rebuilt with the same structure and gives the same logits
    vocab = result.plan.model.vocab_size
    again = rack_from_stacks(
        result.plan, vocab, result.output_dir, result.output_dir / "model.safetensors"
    )
    x = pattern_rows(2)
    result.rack.eval()
    assert torch.allclose(result.rack(x, None, None), again.eval()(x, None, None), atol=1e-5)


def test_end_to_end_refuses_to_shard_the_blocks_it_is_handed(tmp_path):
    """Under FSDP the caller's blocks would end as shards with no whole model to save."""
    config = TrainingConfig(strategy="end_to_end", end_to_end_scope="rackwise")
    shrink(config, tmp_path, steps=2)
    config.parallel.strategy = "fsdp"
    trainer = UnifiedTrainer(config)
    with pytest.raises(StackWiseError, match="UnifiedTrainer trains the blocks you hand it"):
        trainer.train_all_layers(dataloader, trainer.new_layers())


# -- time-step masking: the grid, the bins, the fraction per step -----------------------------


def masked_share_per_step(objective: Diffusion, rows: torch.Tensor) -> dict[int, float]:
    gen = torch.Generator().manual_seed(0)
    counts: dict[int, list[float]] = {}
    for _ in range(60):
        prep = objective.prepare({"input_ids": rows}, gen)
        masked = (prep.targets != -100).float().mean(dim=1)
        for t, share in zip(prep.t.tolist(), masked.tolist(), strict=True):
            counts.setdefault(round(t * objective.num_time_steps) - 1, []).append(share)
    return {k: statistics.mean(v) for k, v in counts.items()}


def test_time_step_masking(tmp_path):
    config = TrainingConfig(
        time_step_masking=True,
        num_time_steps=10,
        time_step_bins=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        time_step_mask_fractions={
            0: 0.15,  # Early time steps: low masking
            5: 0.50,  # Middle time steps: medium masking
            9: 0.90,  # Late time steps: high masking
        },
        store_all_time_steps=False,
        time_step_cache_size=1,
    )
    m = config.masking
    assert (m.schedule, m.num_time_steps, m.time_step_bins) == ("table", 10, list(range(10)))
    c = config.progressive.cache
    assert (c.store_all_time_steps, c.time_step_cache_size) == (False, 1)
    result = UnifiedTrainer(shrink(config, tmp_path)).train_all_layers(dataloader)
    rows = pattern_rows(64, seed=1)
    _, specials = vocabulary({"input_ids": rows}, None, True, None)
    objective = objective_from(result.plan.objective, result.plan.masking, specials)
    shares = masked_share_per_step(objective, rows)
    assert sorted(shares) == list(range(10))  # every bin drawn, on the grid
    for step, want in {0: 0.15, 2: 0.29, 5: 0.5, 9: 0.9}.items():
        assert abs(shares[step] - want) < 0.05, (step, shares[step])
    bins = TrainingConfig(time_step_masking=True, time_step_bins=[0, 5, 9], num_time_steps=10)
    assert bins.masking.schedule == "linear"  # no table given
    narrow = objective_from(result.plan.objective, bins.masking, specials)
    assert sorted(masked_share_per_step(narrow, rows)) == [0, 5, 9]  # only the bins drawn
    assert TrainingConfig(time_step_masking=True).masking.num_time_steps == 10  # the default
    with pytest.raises(StackWiseError) as err:
        TrainingConfig(time_step_masking=False, num_time_steps=10)
    assert "time_step_masking is false" in one_paragraph(err)


# -- quantization and QLoRA: storage, adapters, autocast --------------------------------------

QUANT = dict(
    quantization_enabled=True,
    quantization_type="nf_fp8",  # or "fp16", "fp32"
    mixed_precision=True,
    backbone_quantized=True,
    adapters_full_precision=True,
    qlora_enabled=True,
    qlora_rank=16,
    qlora_alpha=32,
)


def test_quantization_qlora(tmp_path):
    config = TrainingConfig(
        quantization_enabled=True,
        quantization_type="nf_fp8",  # or "fp16", "fp32"
        mixed_precision=True,
        backbone_quantized=True,
        adapters_full_precision=True,
        qlora_enabled=True,
        qlora_rank=16,
        qlora_alpha=32,
    )
    assert (config.quant.type, config.train.mixed_precision) == ("fp8", "auto")
    result = UnifiedTrainer(shrink(config, tmp_path, fp32=False)).train_all_layers(dataloader)
    # end to end (no strategy given): every stack stored fp8 under a rank-16 fp32 adapter
    q = result.rack.stacks[0].blocks[0].attn.q_proj
    assert isinstance(base_of(q), FP8Linear)
    assert (q.r["stack"], q.scaling["stack"]) == (16, 2.0)
    assert q.lora_A["stack"].weight.dtype == torch.float32
    assert result.runner.accelerator.mixed_precision == resolve_precision("auto")
    stored, weights = weight_bytes(result.rack.stacks[0])
    assert 2.0 <= 4 * weights / stored <= 4.0  # the memory the seed promises: 2-4x less


@pytest.mark.parametrize(
    ("change", "trunk_dtype", "adapter_dtype", "autocast"),
    [
        ({}, torch.uint8, torch.float32, "auto"),  # nf_fp8: packed codes
        ({"quantization_type": "fp16"}, torch.float16, torch.float32, "auto"),
        ({"quantization_type": "fp32"}, torch.float32, torch.float32, "auto"),
        ({"adapters_full_precision": False}, torch.uint8, torch.bfloat16, "auto"),
        ({"mixed_precision": False}, torch.uint8, torch.float32, "no"),
    ],
)
def test_quantization_keys_on_a_grown_rack(tmp_path, change, trunk_dtype, adapter_dtype, autocast):
    config = TrainingConfig(**{**QUANT, **change}, mode="blockwise", block_size=1)
    shrink(config, tmp_path, fp32=False)
    result = UnifiedTrainer(config).train_all_layers(dataloader)
    trunk = result.rack.stacks[0].blocks[0].attn.q_proj
    assert base_of(trunk).weight.dtype == trunk_dtype  # the trunk's storage
    assert trunk.lora_A["stack"].weight.dtype == adapter_dtype
    assert result.runner.accelerator.mixed_precision == resolve_precision(autocast)
    new = result.rack.stacks[1].blocks[0].attn.q_proj
    assert base_of(new).weight.dtype == torch.float32  # the new stack trained whole


def test_backbone_unquantized_qlora_is_refused_in_one_paragraph():
    with pytest.raises(StackWiseError) as err:
        TrainingConfig(**{**QUANT, "backbone_quantized": False}, mode="blockwise")
    assert "backbone_quantized" in one_paragraph(err)


# -- the option lists: every key lands on a working key ---------------------------------------

CACHED = {"time_step_masking": True, "mode": "blockwise", "cache_mode": "stack"}
QLORA = {"quantization_enabled": True, "qlora_enabled": True}
OPTIONS: dict[str, tuple[Any, dict[str, Any], Any]] = {
    # seed key: (value, the keys it needs beside it, our key's value)
    "mode": ("layerwise", {}, "layerwise"),
    "block_size": (3, {}, 3),
    "strategy": ("progressive", {}, "progressive"),
    "end_to_end_scope": ("stackwise", {"strategy": "end_to_end"}, "stackwise"),
    "progressive.target_stacks": (8, {"strategy": "progressive"}, 8),
    "time_step_masking": (True, {}, True),
    "num_time_steps": (12, {"time_step_masking": True}, 12),
    "time_step_bins": ([1, 3], {"time_step_masking": True}, [1, 3]),
    "time_step_mask_fractions": ({0: 0.2, 9: 0.9}, {"time_step_masking": True}, {0: 0.2, 9: 0.9}),
    "store_all_time_steps": (True, CACHED, True),
    "time_step_cache_size": (2, CACHED, 2),
    "quantization_enabled": (True, {"mode": "blockwise"}, True),
    "quantization_type": ("nf_fp8", {"quantization_enabled": True, "mode": "blockwise"}, "fp8"),
    "mixed_precision": (True, {}, "auto"),
    "backbone_quantized": (True, {"quantization_enabled": True, "mode": "blockwise"}, True),
    "adapters_full_precision": (False, QLORA, False),
    "qlora_enabled": (True, {}, True),
    "qlora_rank": (16, {"qlora_enabled": True}, 16),
    "qlora_alpha": (32, {"qlora_enabled": True}, 32),
    "qlora.enabled": (True, {}, True),
    "qlora.rank": (4, {"qlora.enabled": True}, 4),
    "qlora.alpha": (8, {"qlora.enabled": True}, 8),
    "qlora.dropout": (0.1, {"qlora.enabled": True}, 0.1),
    "qlora.lr": (1e-3, {"qlora.enabled": True}, 1e-3),
    "qlora.progressive_enabled": (True, {"qlora.enabled": True, "mode": "blockwise"}, True),
    "qlora.strategy": ("progressive", {"qlora.enabled": True}, "progressive"),
    "cache_mode": ("rack", {"mode": "blockwise"}, "rack"),
    "cache_dir": ("CACHE", {"mode": "blockwise"}, "CACHE"),
    "save_stacks": (False, {}, False),
    "save_rack": (False, {}, False),
}  # fmt: skip
# what else a seed key implies (see the layout's `implied`), beside its own key
IMPLIED = {
    "mode": {"progressive.strategy": "progressive", "model.blocks_per_stack": 1},
    "block_size": {"progressive.strategy": "progressive", "model.blocks_per_stack": 3},
    "progressive.target_stacks": {"model.n_stacks": 8},
    "time_step_masking": {"objective.name": "diffusion", "masking.num_time_steps": 10},
    "time_step_mask_fractions": {"masking.schedule": "table"},
    "cache_mode": {"progressive.cache.enabled": True},
    "cache_dir": {"progressive.cache.enabled": True, "progressive.cache.storage": "disk"},
}


def keywords(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted seed paths (`qlora.rank`) as the nested keywords TrainingConfig takes."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        *where, leaf = path.split(".")
        node = out
        for part in where:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def test_configuration_options(tmp_path):
    assert sorted(OPTIONS) == sorted(LAYOUT.keys)  # every key of the seed's lists
    for key, (value, context, want) in OPTIONS.items():
        value = str(tmp_path) if value == "CACHE" else value
        want = str(tmp_path) if want == "CACHE" else want
        config = TrainingConfig(**keywords({**context, key: value}))
        assert get_path(config, LAYOUT.keys[key].target) == want, key
        for path, implied in IMPLIED.get(key, {}).items():
            assert get_path(config, path) == implied, (key, path)


def test_cache_and_saving_keys_change_the_run(tmp_path):
    """cache_mode / cache_dir turn the activation cache on (on disk, in cache_dir), save_rack
    false leaves the whole-rack weights out and save_stacks keeps the stack files."""
    config = TrainingConfig(
        mode="blockwise",
        block_size=1,
        cache_mode="stack",
        cache_dir=str(tmp_path / "cache"),
        save_stacks=True,
        save_rack=False,
    )
    result = UnifiedTrainer(shrink(config, tmp_path, steps=8)).train_all_layers(dataloader)
    cache = result.plan.progressive.cache
    assert (cache.enabled, cache.storage, cache.dir) == (True, "disk", str(tmp_path / "cache"))
    stage = result.progressive.stacks[1].cache
    assert stage["hits"] + stage["misses"] > 0  # stage 2 read its trunk from the cache
    assert not (result.output_dir / "model.safetensors").exists()
    assert (result.output_dir / "stacks" / "stack_1.safetensors").is_file()


def test_unknown_keywords_name_the_seed_keys():
    with pytest.raises(StackWiseError) as err:
        TrainingConfig(time_step_maskng=True)
    text = one_paragraph(err)
    assert "did you mean 'time_step_masking'" in text and "qlora_rank" in text


# -- the module tree: each part is a real component ------------------------------------------


def test_architecture(tmp_path):
    from stackwise.progressive import ActivationCache, ProgressiveRecipe
    from stackwise.registry import SCHEDULES

    # unified_trainer.py: UnifiedTrainer; block_trainer.py: one stage of the recipe;
    # fusion_trainer.py: joint tuning; strategies: masking schedules, quantization, caching
    assert callable(ProgressiveRecipe.train_stage) and callable(ProgressiveRecipe.joint_tuning)
    assert {"linear", "cosine", "table"} <= set(SCHEDULES.names())
    assert callable(stackwise.quantize_linears) and ActivationCache is stackwise.ActivationCache
    config = TrainingConfig(mode="fused", block_size=1, progressive={"joint_tuning_steps": 4})
    result = UnifiedTrainer(shrink(config, tmp_path)).train_all_layers(dataloader)
    assert [s.stage for s in result.stages] == [0, 1, "joint"]  # the stages, then fusion
    assert len(result.stages[-1].losses) == 4 and result.progressive.joint["steps"] == 4


def test_layerwise_mode_and_refusals(tmp_path):
    config = shrink(TrainingConfig(mode="layerwise"), tmp_path)
    trainer = UnifiedTrainer(config)
    layers = trainer.new_layers(3)
    result = trainer.train_all_layers(dataloader, layers)
    assert [s.layers for s in result.stages] == [[0], [1], [2]]  # one layer per stage
    with pytest.raises(StackWiseError) as err:
        trainer.train_all_layers(dataloader, [torch.nn.Linear(4, 4)])
    assert "stackwise.Block" in one_paragraph(err)
    causal = UnifiedTrainer(shrink(TrainingConfig(time_step_masking=True), tmp_path))
    with pytest.raises(StackWiseError) as err:
        causal.train_all_layers(dataloader, layers)  # clm layers for a diffusion objective
    assert "bidirectional" in one_paragraph(err)


# -- the example script --------------------------------------------------------------------


def test_example_script(tmp_path):
    path = ROOT / "examples" / "unified_trainer_example.py"
    spec = importlib.util.spec_from_file_location("unified_trainer_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(steps=4, d_model=32, output_dir=tmp_path, quiet=True)
    assert set(results) == {"layerwise", "blockwise", "fused", "rackwise"}
    assert [s.stage for s in results["fused"].stages][-1] == "joint"


def test_a_tokenizer_gives_the_vocabulary_and_is_saved_with_the_run(tmp_path):
    from stackwise.data.tokenizer import make_tokenizer

    tok = make_tokenizer("byte", [], 2048, str(tmp_path / "tok"))
    ids = [torch.tensor(tok("the king speaks to the queen " * 3)["input_ids"][:24])] * 32
    config = shrink(TrainingConfig(mode="layerwise", time_step_masking=True), tmp_path)
    trainer = UnifiedTrainer(config, tokenizer=tok)
    result = trainer.train_all_layers(DataLoader(ids, batch_size=8), trainer.new_layers(2))
    plan, rack, loaded = stackwise.load_trained(result.output_dir)
    assert rack.vocab_size == len(tok) == len(loaded) and plan.objective.name == "diffusion"
