"""Rules of Hugging Face fine-tuning and instruction data: what each model source and data mode
reads, so that a key the run would ignore is refused instead."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule, section_rule
from stackwise.config.root import Config
from stackwise.config.sections import RACK_SHAPE_FIELDS, DataConfig, ModelConfig
from stackwise.registry import OBJECTIVES

RACK_SHAPE = (*RACK_SHAPE_FIELDS, "dropout", "init_std", "init_from_hf")
HF_ONLY = [
    "model_name_or_path",
    "dtype",
    "load_in_4bit",
    "load_in_8bit",
    "quant_type_4bit",
    "double_quant",
    "compute_dtype",
    "quant_storage",
    "attn_implementation",
    "trust_remote_code",
]
FOUR_BIT = ("quant_type_4bit", "double_quant", "compute_dtype", "quant_storage")
CHAT_ONLY = [
    "chat_format",
    "chat_template",
    "train_on",
    "train_on_eos",
    "drop_unsupervised",
    "packing",
    "padding_free",
    "eval_files",
    "dataset_dir",
    "dataset_name",
    "dataset_subset",
    "dataset_split",
]
PRETRAIN_TOO = ("dataset_dir", "dataset_name", "dataset_subset", "dataset_split")
PRETRAIN_ONLY = ("source", "mix", "format", "bpe_vocab_size", "bpe_sample_mb", "cache_dir")
LORA_HF = [
    "target_modules",
    "use_dora",
    "use_rslora",
    "init_lora_weights",
    "modules_to_save",
    "save_merged",
]
LORA_RACK = ("strategy", "rank_pattern", "alpha_pattern", "per_stack", "trunk_adapters")


@section_rule("ModelConfig")
def model_source(s: ModelConfig) -> Iterator[str]:
    if s.source == "hf":
        if not s.model_name_or_path:
            yield "model.source: hf needs model.model_name_or_path (a local model dir)"
        for name in RACK_SHAPE:
            if s.changed(name):
                yield (
                    f"model.{name} shapes a StackWise rack; a Hugging Face model "
                    "(model.source: hf) takes its shape from its own config. Remove it"
                )
    else:
        for name in HF_ONLY:
            if s.changed(name):
                yield (
                    f"model.{name} only applies to Hugging Face models; set model.source: hf "
                    "with model.model_name_or_path, or remove it"
                )
    if s.load_in_4bit and s.load_in_8bit:
        yield "model.load_in_4bit and model.load_in_8bit exclude each other; keep one"
    if not s.load_in_4bit:
        for name in FOUR_BIT:
            if s.changed(name):
                yield f"model.{name} only applies with model.load_in_4bit: true; remove it"


@section_rule("DataConfig")
def data_mode(s: DataConfig) -> Iterator[str]:
    if s.mode == "pretraining":
        for name in CHAT_ONLY:
            if s.changed(name) and name not in PRETRAIN_TOO:
                yield f"data.{name} only applies to data.mode: instruction; set it or remove it"
        return
    for name in PRETRAIN_ONLY:
        if s.changed(name):
            yield (
                f"data.{name} only applies to pretraining text; instruction data is read from "
                "data.files, data.dataset_dir or data.dataset_name. Remove it"
            )
    if s.eval_files and s.changed("val_fraction"):
        yield "data.val_fraction splits evaluation rows off; with data.eval_files remove it"


@cross_rule
def hf_runs(cfg: Config) -> Iterator[str]:
    """What a Hugging Face run reads, and the rack keys it would ignore."""
    hf, lora = cfg.model.source == "hf", cfg.lora
    chat = cfg.data.mode == "instruction"
    if hf and not chat:
        yield "a Hugging Face model (model.source: hf) trains on data.mode: instruction"
    if hf and chat and cfg.data.tokenizer is not None:
        yield "data.tokenizer: a Hugging Face model brings its own tokenizer; remove it"
    if not hf:
        for name in LORA_HF:
            if lora.changed(name):
                yield f"lora.{name} only applies to Hugging Face models (model.source: hf)"
        if lora.loraplus_lr_ratio is not None:
            yield "lora.loraplus_lr_ratio only applies to Hugging Face models (model.source: hf)"
        if cfg.train.group_lr.base is not None:
            yield "train.group_lr.base only applies to Hugging Face models (model.source: hf)"
        return
    if not OBJECTIVES.capabilities(cfg.objective.name).hf_models:
        ready = " or ".join(n for n in OBJECTIVES.names() if OBJECTIVES.capabilities(n).hf_models)
        yield (
            f"objective {cfg.objective.name} is not available for Hugging Face models yet; "
            f"fine-tune them with objective {ready}"
        )
    p = cfg.progressive
    if p.strategy != "end_to_end" or p.end_to_end_scope != "rackwise":
        yield "progressive growth and local losses build racks; a Hugging Face model trains whole"
    for name in ("save_rack", "save_stacks"):
        if p.changed(name):
            yield (
                f"progressive.{name} chooses what a rack run saves; a fine-tuned model always "
                "saves its adapter (or weights). Remove it"
            )
    for name in ("attention", "weighting", "random_length_ratio"):
        if cfg.objective.changed(name):
            yield (
                f"objective.{name} applies to racks; a Hugging Face causal LM attends causally "
                "and scores every target of its instruction rows. Remove it"
            )
    if cfg.quant.enabled:
        yield "quant.* quantizes rack stacks; quantize a Hugging Face base with model.load_in_4bit"


@cross_rule
def hf_lora(cfg: Config) -> Iterator[str]:
    """LoRA and LR groups of a Hugging Face run."""
    if cfg.model.source != "hf":
        return
    m, lora = cfg.model, cfg.lora
    if (m.load_in_4bit or m.load_in_8bit) and not lora.enabled and not cfg.memory_on:
        yield (
            "a quantized base (model.load_in_4bit/8bit) is frozen, so only LoRA (or memory) can "
            "train: set lora.enabled: true"
        )
    for name in LORA_RACK:
        if lora.changed(name):
            yield f"lora.{name} applies to rack stacks; a Hugging Face model takes one adapter"
    for name in ("trunk_rank", "trunk_alpha"):
        if lora.changed(name):
            yield f"lora.{name} applies to progressive rack trunks, not Hugging Face models"
    if not lora.enabled:
        for name in (*LORA_HF, "rank", "alpha", "dropout", "loraplus_lr_ratio"):
            if lora.changed(name):
                yield f"lora.{name} needs lora.enabled: true"
    if lora.init_lora_weights == "loftq" and not m.load_in_4bit:
        yield "lora.init_lora_weights: loftq initializes from a 4-bit base; set model.load_in_4bit"
    gl = cfg.train.group_lr
    if gl.lora is not None and not lora.enabled:
        yield "train.group_lr.lora (the lora_lr) needs lora.enabled: true"
    if gl.base is not None and lora.enabled and not lora.modules_to_save:
        yield (
            "train.group_lr.base sets the LR of base weights that train, and with LoRA none do "
            "unless lora.modules_to_save names some; remove it or add modules_to_save"
        )
    for group in ("embeddings", "blocks", "head", "time", "trunk"):
        if getattr(cfg.train.group_lr, group) is not None:
            yield (
                f"train.group_lr.{group} names a rack parameter group; a Hugging Face model has "
                "the groups lora, base and memory"
            )


@cross_rule
def epochs(cfg: Config) -> Iterator[str]:
    if cfg.train.num_train_epochs is None or cfg.data.streaming:  # a stream: rules_stream
        return
    if cfg.train.changed("max_steps"):
        yield "train.num_train_epochs sets train.max_steps from the data; remove one of them"
    p = cfg.progressive
    if p.strategy == "progressive" and p.growth.schedule != "budget_share":
        yield (
            "a progressive run budgets each stack: use progressive.epochs_per_stack instead, "
            "or progressive.growth.schedule budget_share to split the epochs' steps by shares"
        )


@cross_rule
def rack_chat(cfg: Config) -> Iterator[str]:
    """A rack on instruction data: causal LM or masked diffusion, end to end, unpacked."""
    d = cfg.data
    if cfg.model.source != "rack" or d.mode != "instruction":
        return
    if d.tokenizer is None or d.tokenizer == "char":
        yield (
            "a rack on instruction data needs data.tokenizer: a local tokenizer dir (its chat "
            "template is used, or ours) or byte; a tokenizer trained on the rows is not built"
        )
    if not OBJECTIVES.capabilities(cfg.objective.name).instruction_rows:
        able = [n for n in OBJECTIVES.names() if OBJECTIVES.capabilities(n).instruction_rows]
        yield f"objective {cfg.objective.name} on instruction data: use {' or '.join(able)}"
    if cfg.progressive.strategy != "end_to_end" or cfg.progressive.end_to_end_scope != "rackwise":
        yield "instruction data trains a rack end to end; progressive growth reads pretraining text"
    if d.packing:
        yield "data.packing needs a Hugging Face model; a rack attends across packed examples"
    if d.padding_free is True:
        yield (
            "data.padding_free needs a Hugging Face model; a rack attends across the examples "
            "of a row. Remove it (rack batches are padded)"
        )
    if cfg.objective.random_length_ratio:
        yield "objective.random_length_ratio cuts pretraining rows; remove it for instruction data"
