"""Every config field does something: changing it either changes the run or is refused.

The table below must name every leaf field of the schema (the first test enforces that), so a new
field cannot be added without showing what it does.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_corpus, tiny_dict
from pydantic import BaseModel

from stackwise.config import Config, from_dict
from stackwise.errors import StackWiseError
from stackwise.generate import sample_texts
from stackwise.pipeline import train_from_config

DIFF = {"objective": {"name": "diffusion"}}
MLM = {"objective": {"name": "mlm"}}
TABLE = {
    "objective": {"name": "diffusion"},
    "masking": {
        "schedule": "table",
        "num_time_steps": 8,
        "time_step_mask_fractions": {0: 0.2, 7: 0.9},
    },
}
GRID = {"objective": {"name": "diffusion"}, "masking": {"num_time_steps": 8}}
PG = {
    "objective": {"name": "diffusion"},
    "model": {"n_stacks": 2, "blocks_per_stack": 1},
    "progressive": {"strategy": "progressive"},
}


# field -> (value to try, context the field needs to matter). Special cases are in CUSTOM.
GENERIC: dict[str, tuple[Any, dict]] = {
    "model.vocab_size": (400, {}),
    "model.d_model": (48, {}),
    "model.n_heads": (4, {}),
    "model.n_kv_heads": (1, {}),
    "model.n_stacks": (2, {}),
    "model.blocks_per_stack": (1, {}),
    "model.ffn_hidden": (40, {}),
    "model.max_seq_len": (16, {}),  # below data.seq_len: refused
    "model.rope_theta": (100.0, {}),
    "model.norm_eps": (1e-2, {}),
    "model.dropout": (0.2, {}),
    "model.tie_embeddings": (False, {}),
    "model.frozen_up_proj": (True, {}),
    "model.time_conditioning": ("sinusoidal", DIFF),
    "model.time_embedding_dim": (16, {**DIFF, "model": {"time_conditioning": "sinusoidal"}}),
    "model.init_std": (0.05, {}),
    "model.attention_bias": (True, {}),
    "data.source": ("shakespeare", {}),  # with files given: refused
    "data.files": ("SECOND_CORPUS", {}),
    "data.format": ("json", {}),
    "data.text_field": ("body", {}),  # plain-text files have no fields: refused
    "data.mode": ("instruction", {}),
    "data.seq_len": (16, {}),
    "data.num_samples": (8, {}),
    "data.val_fraction": (0.2, {}),
    "data.tokenizer": ("SAVED_TOKENIZER", {"data": {"bpe_vocab_size": 2048}}),
    "data.bpe_vocab_size": (320, {}),
    "data.bpe_sample_mb": (0.004, {}),  # one piece in 4 or so of the tiny corpus
    "objective.name": ("mlm", {}),
    "objective.attention": ("bidirectional", {}),
    "objective.weighting": ("uniform", DIFF),
    "masking.mask_ratio": (0.5, MLM),
    "masking.bert_mix": (True, MLM),
    "masking.schedule": ("cosine", DIFF),
    "masking.eps": (0.2, DIFF),
    "masking.antithetic": (False, DIFF),
    "masking.num_time_steps": (4, DIFF),
    "masking.time_step_masking": (True, DIFF),  # a grid of 10 steps
    "masking.time_step_bins": ([0, 3], GRID),
    "masking.time_step_mask_fractions": ({0: 0.5, 7: 0.6}, TABLE),
    "train.seed": (7, {}),
    "train.max_steps": (3, {}),
    "train.batch_size": (2, {}),
    "train.grad_accum_steps": (2, {}),
    "train.lr": (1e-2, {}),
    "train.group_lr.embeddings": (1e-5, {}),
    "train.group_lr.blocks": (1e-5, {}),
    "train.group_lr.head": (1e-5, {"model": {"tie_embeddings": False}}),
    "train.group_lr.time": (1e-5, {**DIFF, "model": {"time_conditioning": "sinusoidal"}}),
    "train.weight_decay": (0.5, {}),
    "train.betas": ((0.5, 0.9), {}),
    "train.adam_eps": (1e-3, {}),
    "train.fused_adamw": (False, {}),  # the default (auto) fuses on a CPU
    "train.max_grad_norm": (1e-3, {}),
    "train.scheduler": ("linear", {}),
    "train.warmup_steps": (2, {}),
    "train.warmup_ratio": (0.5, {}),
    "train.min_lr_ratio": (0.5, {}),
    "train.poly_power": (2.0, {"train": {"scheduler": "polynomial"}}),
    "train.mixed_precision": ("bf16", {}),
    "train.eval_every": (1, {}),
    "train.eval_batches": (1, {}),
    "logging.run_name": ("named", {}),  # with output_dir given: refused
    "logging.log_every": (1, {}),
    "logging.console": (True, {}),
    "logging.jsonl": (False, {}),
    "logging.tensorboard": (True, {}),
    "logging.progress_bar": ("always", {}),
    "sample.num_samples": (2, {}),
    "sample.prompt": ("the king", {}),
    "sample.max_new_tokens": (3, {}),
    "sample.temperature": (0.0, {}),
    "sample.top_k": (2, {}),
    "sample.top_p": (0.1, {}),
    "objective.random_length_ratio": (0.5, DIFF),
    "objective.block_size": (2, {"objective": {"name": "block_diffusion", "block_size": 4}}),
    "objective.block_shift": (False, {"objective": {"name": "block_diffusion", "block_size": 4}}),
    "sample.steps": (1, DIFF),
    "sample.sampler": ("remask", DIFF),
    "sample.remasking": ("random", {**DIFF, "sample": {"sampler": "remask"}}),
    "sample.block_length": (2, DIFF),
    "sample.confidence_threshold": (0.001, {**DIFF, "sample": {"sampler": "confidence"}}),
    "sample.remask_budget": (0.5, {**DIFF, "sample": {"sampler": "remdm"}}),
    "progressive.strategy": ("progressive", DIFF),
    "progressive.end_to_end_scope": ("stackwise", {"model": {"n_stacks": 2}}),
    "progressive.building_mode": ("prepend", PG),
    "progressive.target_stacks": (3, PG),
    "progressive.trunk_strategy": ("full", PG),
    "progressive.head_policy": ("always", PG),
    "progressive.new_stack_precision": ("bf16", PG),
    "progressive.steps_per_stack": (1, PG),
    "progressive.epochs_per_stack": (0.05, PG),
    "progressive.stacks": ({1: {"lr": 0.1}}, PG),
    "progressive.time_interpretation": ("depth", PG),
    "progressive.lr_schedule": ("global", PG),
    "progressive.depth_mapping": ("exponential", "PGD"),
    "progressive.depth_order": ("high_to_low", "PGD"),
    "progressive.depth_growth": (4.0, "PGD_EXP"),
    "progressive.time_per_stack": (1, "PGD_GRID"),
    "progressive.save_stacks": (False, PG),
    "progressive.save_rack": (False, PG),
    "progressive.cache.enabled": (True, PG),
    "progressive.cache.dtype": ("fp16", "PGC"),
    "progressive.cache.max_bytes": (32 * 32 * 2 * 3, "PGC"),
    "progressive.cache.on_full": ("error", "PGC_BUDGET"),
    "progressive.cache.store_all_time_steps": (True, "PGC_GRID"),
    "progressive.cache.time_step_cache_size": (2, "PGC"),
    "progressive.cache.mode": ("rack", "PGC"),
    "train.group_lr.lora": (0.5, "PGL"),
    "train.group_lr.trunk": (
        0.5,
        {**PG, "progressive": {**PG["progressive"], "trunk_strategy": "full"}},
    ),
    "lora.enabled": (True, PG),  # no frozen weights to adapt there: refused
    "lora.rank": (2, "PGL"),
    "lora.alpha": (4.0, "PGL"),
    "lora.dropout": (0.5, "PGL"),
    "lora.strategy": ("variable", "PGL"),  # without a per_stack table: refused
    "lora.rank_pattern": ("increasing", "PGL_PROG"),
    "lora.alpha_pattern": ("linear", "PGL_PROG"),
    "lora.per_stack": ({1: {"rank": 2}}, "PGL_VAR"),
    "lora.trunk_adapters": (True, "PGL"),
    "lora.trunk_rank": (2, "PGL_TRUNK"),
    "lora.trunk_alpha": (2.0, "PGL_TRUNK"),
    "quant.enabled": (True, PG),
    "quant.type": ("fp8", "PGQ"),
    "quant.double_quant": (True, "PGQ"),
    "quant.backbone_quantized": (False, "PGQ"),  # then nothing is quantized: refused
    "quant.adapters_full_precision": (False, "PGQL"),
    "train.save_steps": (2, {}),
    "train.save_total_limit": (1, {"train": {"save_steps": 1}}),
    "train.save_best_model": (True, {}),
}

CUSTOM = {
    # tested in test_token_store.py: a weighted mixture trains by its weights and resumes
    "data.mix",
    # tested in test_streaming.py: streamed files, datasets and growth resume bit for bit, and
    # the first stream_val_blocks blocks validate
    "data.streaming",
    "data.stream_val_blocks",
    # tested in test_moe.py: an MoE rack trains, logs its routing, grows on a dense trunk,
    # and every setting reaches its layers
    "model.moe.num_experts",
    "model.moe.top_k",
    "model.moe.capacity_factor",
    "model.moe.shared_expert",
    "model.moe.router_jitter",
    "model.moe.expert_hidden",
    "model.moe.stacks",
    "model.moe.load_balance_coef",
    "model.moe.auxiliary_coef",
    "model.moe.z_loss_coef",
    # tested in test_memory.py: memory layers train on racks and HF models, each setting
    # reaches them, the memory LR its group, and misplaced settings are refused
    "memory.chapters",
    "memory.slots_per_chapter",
    "memory.top_k",
    "memory.layers",
    "memory.load_balance_coef",
    "memory.auxiliary_coef",
    "memory.z_loss_coef",
    "train.group_lr.memory",
    # tested in test_progressive.py: modes (shape and joint tuning), the custom depth table,
    # and disk storage (which must train exactly like memory, so a fingerprint cannot differ)
    "progressive.mode",
    "progressive.block_size",
    "progressive.joint_tuning_steps",
    "progressive.depth_time_table",
    "progressive.cache.storage",
    "progressive.cache.dir",
    "model.gradient_checkpointing",
    "data.cache_dir",
    "data.num_workers",
    "train.compile",
    "train.output_dir",
    "train.overwrite_output_dir",
    # tested in test_checkpoints.py: resume, best-model metric and direction, early stopping,
    # NaN skipping, extensions by name, W&B (offline) and its project
    "train.resume_from_checkpoint",
    "train.metric_for_best",
    "train.greater_is_better",
    "train.early_stopping_patience",
    "train.early_stopping_threshold",
    "train.skip_nonfinite_steps",
    "train.enabled_extensions",
    "logging.log_to_wandb",
    "logging.wandb_project",
    # tested in tests/seeds/test_seed_002.py: a curriculum strategy of the user's reads its
    # stages from them; a strategy of ours given options is refused
    "train.strategy_options",
    # tested in tests/seeds/test_seed_001.py: the process count checked against the launch,
    # Adam, the saved weights' dtype, the early-stopping switch, the sharding note under DDP
    "train.num_processes",
    "train.optimizer",
    "train.save_precision",
    "train.early_stopping",
    "parallel.sharding",
    # tested in test_fsdp.py: sharding layouts, bf16 gathers and reductions, the offload note
    "parallel.shard_group_size",
    "parallel.param_dtype",
    "parallel.reduce_dtype",
    "parallel.cpu_offload",
    "train.consolidated_weights",
    # tested in test_deepspeed_config.py and test_deepspeed.py: the file's keys reach the
    # engine's config, and the seed's --deepspeed_config line trains under ZeRO-3
    "parallel.deepspeed_config",
    # tested in test_families.py: a toy growth operator and a toy parallelizer named in a config
    "progressive.growth.init",
    "parallel.strategy",
    # tested in test_growth_operators.py: noise on copied weights (and its absence: exact copies)
    "progressive.growth.noise",
    # tested in test_growth_schedule.py: budget shares, growth on a plateau, the WSD schedule
    "progressive.growth.schedule",
    "progressive.growth.shares",
    "progressive.growth.patience",
    "progressive.growth.min_delta",
    "train.decay_ratio",
    # tested in test_repeat_guard.py: a repeated word is redrawn; refused where it cannot work
    "sample.no_repeat_words",
    # tested in test_export_hf.py: an exported Llama imported back, and adapted to diffusion
    "model.init_from_hf",
    # Hugging Face fine-tuning: tested on HF runs in test_finetune_fields.py (HF_FIELDS)
    "model.source",
    "model.model_name_or_path",
    "model.dtype",
    "model.load_in_4bit",
    "model.load_in_8bit",
    "model.quant_type_4bit",
    "model.double_quant",
    "model.compute_dtype",
    "model.quant_storage",
    "model.attn_implementation",
    "model.trust_remote_code",
    "data.chat_format",
    "data.chat_template",
    "data.train_on",
    "data.train_on_eos",
    "data.drop_unsupervised",
    "data.packing",
    "data.padding_free",
    "data.eval_files",
    "data.dataset_dir",
    "data.dataset_name",
    "data.dataset_subset",
    "data.dataset_split",
    "train.num_train_epochs",
    "train.group_lr.base",
    "lora.target_modules",
    "lora.use_dora",
    "lora.use_rslora",
    "lora.init_lora_weights",
    "lora.loraplus_lr_ratio",
    "lora.modules_to_save",
    "lora.save_merged",
}


def named_context(name: str) -> dict:
    """Contexts built from PG: depth time, an enabled cache over a few samples, LoRA, quant."""
    depth = merge(PG, {"progressive": {"time_interpretation": "depth"}})
    cache = merge(
        PG,
        {
            "model": {"n_stacks": 3},
            "data": {"num_samples": 16},
            "train": {"max_steps": 12},
            "progressive": {"cache": {"enabled": True}},
        },
    )
    lora = merge(
        PG, {"progressive": {"new_stack_precision": "fp8"}, "lora": {"enabled": True, "rank": 4}}
    )
    quant = merge(PG, {"quant": {"enabled": True}})
    return {
        "PGL": lora,
        "PGL_PROG": merge(lora, {"lora": {"strategy": "progressive"}}),
        "PGL_VAR": merge(lora, {"lora": {"strategy": "variable", "per_stack": {0: {"rank": 2}}}}),
        "PGL_TRUNK": merge(lora, {"lora": {"trunk_adapters": True}}),
        "PGQ": quant,
        "PGQL": merge(lora, {"quant": {"enabled": True, "backbone_quantized": False}}),
        "PGD": depth,
        "PGD_EXP": merge(depth, {"progressive": {"depth_mapping": "exponential"}}),
        "PGD_GRID": merge(depth, {"masking": {"num_time_steps": 8}}),
        "PGC": cache,
        "PGC_BUDGET": merge(cache, {"progressive": {"cache": {"max_bytes": 32 * 32 * 2 * 3}}}),
        "PGC_GRID": merge(cache, {"masking": {"num_time_steps": 4}}),
    }[name]


def leaf_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaf_fields(ann, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_schema_field_is_covered():
    fields = set(leaf_fields(Config))
    covered = set(GENERIC) | CUSTOM
    assert fields - covered == set(), "add the new field to GENERIC or CUSTOM"
    assert covered - fields == set(), "stale entries"


def merge(base: dict, extra: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def set_path(data: dict, path: str, value: Any) -> dict:
    parts = path.split(".")
    nested: Any = value
    for p in reversed(parts):
        nested = {p: nested}
    return merge(data, nested)


def fingerprint(data: dict, out: Path) -> Any:
    """Everything observable about a run, minus wall-clock numbers."""
    try:
        cfg = from_dict(data)
    except StackWiseError as err:
        return ("refused", str(err))
    buf_out, buf_err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
            res = train_from_config(cfg, quiet=True)
            samples = sample_texts(res.config, res.rack, res.data.tokenizer)
    except StackWiseError as err:
        return ("error", str(err))
    digest = hashlib.sha256()
    for k, v in sorted(res.rack.state_dict().items()):
        digest.update(k.encode())
        digest.update(v.float().numpy().tobytes())
    rows = []
    # the wall clock's readings, which differ between two runs of the same computation
    measured = ("time", "train/tokens_per_s", "train/peak_rss_mb")
    for path in sorted(out.rglob("metrics.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows.append({k: v for k, v in row.items() if k not in measured})
    optimizer: Any = None
    if hasattr(res.trainer, "optimizer"):
        opt = res.trainer.optimizer.optimizer
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        optimizer = (repr(opt.defaults), repr(groups))
    if res.state is not None:
        history: Any = res.state.history
    else:
        p = res.progressive
        history = [{k: v for k, v in r.as_dict().items() if k != "seconds"} for r in p.stacks] + [
            p.final_eval,
            {k: v for k, v in (p.joint or {}).items() if k != "seconds"},
        ]
    mask = re.compile(r"[\d.,]+")
    files = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()]
    files = sorted({f.split("/")[0] if f.startswith("tensorboard") else f for f in files})
    return {
        "weights": digest.hexdigest(),
        "data": (
            res.data.train.blocks.sum().item(),
            tuple(res.data.train.blocks.shape),
            tuple(res.data.val.blocks.shape),
            len(res.data.tokenizer),
        ),
        "history": history,
        "metrics": rows,
        "files": files,
        "optimizer": optimizer,
        "samples": samples,
        "stdout": mask.sub("#", buf_out.getvalue()),
        # only our progress bar: datasets prints a one-off "Generating split" bar on a cold cache
        "progress": [ln for ln in mask.sub("#", buf_err.getvalue()).split("\r") if "train:" in ln],
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("fields")
    corpus = root / "a.txt"
    corpus.write_text(make_corpus(300, seed=1))
    second = root / "b.txt"
    second.write_text(make_corpus(300, seed=2))
    from stackwise.data.tokenizer import train_bpe

    tok_dir = root / "tok"
    train_bpe([make_corpus(200, seed=3)], 350).save_pretrained(str(tok_dir))
    return {
        "root": root,
        "corpus": corpus,
        "second": second,
        "tok": tok_dir,
        "cache": cache_dir,
        "memo": {},
        "n": [0],
    }


def run(world: dict, data: dict) -> Any:
    key = json.dumps(data, sort_keys=True, default=str)
    if key not in world["memo"]:
        world["n"][0] += 1
        out = world["root"] / f"run{world['n'][0]}"
        world["memo"][key] = fingerprint(set_path(data, "train.output_dir", str(out)), out)
    return world["memo"][key]


@pytest.mark.parametrize("field", sorted(GENERIC))
def test_field_changes_the_run_or_is_refused(field, world):
    value, context = GENERIC[field]
    if isinstance(context, str):
        context = named_context(context)
    value = (
        {"SECOND_CORPUS": [str(world["second"])], "SAVED_TOKENIZER": str(world["tok"])}.get(
            value, value
        )
        if isinstance(value, str)
        else value
    )
    base = merge(tiny_dict(world["corpus"], world["cache"], world["root"]), context)
    base["train"]["max_steps"] = 4
    if field == "data.tokenizer":  # bpe_vocab_size cannot be set beside a tokenizer dir
        base["data"].pop("bpe_vocab_size")
    before = run(world, base)
    after = run(world, set_path(base, field, value))
    assert before[0] not in ("refused", "error") if isinstance(before, tuple) else True
    assert after != before, f"{field}={value!r} changed nothing"


def test_gradient_checkpointing_recomputes(tiny):
    from stackwise.io.trained import build_rack

    counts = []
    for flag in (False, True):
        cfg = tiny(model={"gradient_checkpointing": flag})
        rack = build_rack(cfg, 300).train()
        calls: list[int] = []
        rack.stacks[0].blocks[0].register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        rack(torch.randint(4, 300, (1, 8))).sum().backward()
        counts.append(len(calls))
    assert counts == [1, 2]


def test_cache_dir_holds_the_tokenizer(tiny, tmp_path):
    from stackwise.data import build_data

    cfg = tiny(data={"cache_dir": str(tmp_path / "c")})
    build_data(cfg.data)
    assert list((tmp_path / "c" / "tokenizers").glob("*/tokenizer.json"))


def test_num_workers_reaches_the_dataloader(tiny):
    from stackwise.data.pack import TokenBlocks
    from stackwise.io.trained import build_rack
    from stackwise.objectives import Specials, build_objective
    from stackwise.pipeline import train_from_config as _  # noqa: F401
    from stackwise.pipeline import trainer_for

    cfg = tiny(data={"num_workers": 2})
    sp = Specials(300, 0, 3, 1, 2)
    tr = trainer_for(
        cfg,
        build_rack(cfg, 300),
        build_objective(cfg, sp),
        TokenBlocks(torch.randint(4, 300, (16, 32))),
    )
    assert tr.data.train.loader(tr.state, 0).num_workers == 2


def test_compile_runs_every_block_through_one_compiled_function(tiny, tmp_path):
    """train.compile on a rack compiles regionally: one compiled function serves both blocks
    (a graph per input shape, not per block), and training matches eager to float rounding."""
    import torch._dynamo

    runs = {}
    for on in (False, True):
        cfg = tiny(train={"compile": on, "max_steps": 2, "output_dir": str(tmp_path / str(on))})
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        runs[on] = train_from_config(cfg, quiet=True)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
        assert (graphs > 0) == on
    stacks = [m for m in runs[True].rack.modules() if type(m).__name__ == "Stack"]
    assert stacks and all(s.fast is None for s in stacks)  # eager again once trained
    assert graphs <= 2  # the training and the evaluation batch shapes; never one per block
    wa, wb = runs[False].rack.state_dict(), runs[True].rack.state_dict()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


def test_output_dir_and_overwrite(tiny, tmp_path):
    target = tmp_path / "exact-place"
    res = train_from_config(tiny(train={"output_dir": str(target)}), quiet=True)
    assert res.output_dir == target and (target / "model.safetensors").is_file()
    before = (target / "model.safetensors").read_bytes()
    with pytest.raises(StackWiseError, match="already holds"):
        train_from_config(tiny(train={"output_dir": str(target)}), quiet=True)
    assert (target / "model.safetensors").read_bytes() == before
    train_from_config(
        tiny(train={"output_dir": str(target), "overwrite_output_dir": True, "seed": 3}), quiet=True
    )
    assert (target / "model.safetensors").read_bytes() != before


def test_fingerprint_is_deterministic(world):
    """Without this, any noise in a run would make every field above look effective."""
    base = tiny_dict(world["corpus"], world["cache"], world["root"])
    base["train"]["max_steps"] = 4
    a = fingerprint(
        set_path(base, "train.output_dir", str(world["root"] / "det1")), world["root"] / "det1"
    )
    b = fingerprint(
        set_path(base, "train.output_dir", str(world["root"] / "det2")), world["root"] / "det2"
    )
    assert isinstance(a, dict) and a == b
