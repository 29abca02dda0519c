"""From the data spec to prepared instruction data: rows, template, targets, rows for the loader."""

from __future__ import annotations

from typing import Any

from stackwise.chat.data import ChatStats, examples_of, to_rows
from stackwise.chat.shared_rows import shared_row_problem
from stackwise.chat.sources import load_rows, split_off
from stackwise.chat.template import use_template
from stackwise.data.pack import PreparedData
from stackwise.data.plain_tokenizer import as_transformers
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec, ModelSpec, Plan


def shared_rows(cfg: DataSpec, model: ModelSpec) -> bool:
    """Whether batches lay several examples in one row (padding-free); packing or padding-free
    asked for where examples could see each other is refused. Racks always pad (their rules
    refuse both)."""
    if model.source != "hf":
        return False
    asked = (
        "data.packing" if cfg.packing else "data.padding_free" if cfg.padding_free is True else None
    )
    problem = shared_row_problem(model) if asked or cfg.padding_free == "auto" else None
    if problem and asked:
        raise StackWiseError(
            f"{asked} lays several examples in one row, but {problem}, so they could attend to "
            f"each other. Use model.attn_implementation: sdpa or eager with a checked "
            f"architecture, or set {asked}: false."
        )
    return cfg.padding_free is True or (cfg.padding_free == "auto" and problem is None)


def build_chat_data(plan: Plan, tok: Any) -> PreparedData:
    """Instruction rows of plan.data rendered with `tok` (its chat template set: use_template);
    plan.model decides whether examples may share a row."""
    cfg = plan.data
    tok = as_transformers(tok)  # chat templates are rendered by transformers' class
    template = use_template(tok, cfg.chat_template)
    rows, eval_rows = load_rows(cfg)
    if eval_rows is None:
        rows, eval_rows = split_off(rows, cfg.val_fraction)
    if cfg.num_samples is not None:
        rows = rows[: cfg.num_samples]
    stats, eval_stats = ChatStats(), ChatStats()
    train = examples_of(rows, tok, cfg, stats)
    val = examples_of(eval_rows, tok, cfg, eval_stats)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    free = shared_rows(cfg, plan.model)
    train_rows = to_rows(train, pad, cfg.packing, cfg.seq_len, free)
    val_rows = to_rows(val, pad, False, cfg.seq_len, free)  # each example scored on its own
    packed = f", packed into {len(train_rows):,} rows" if cfg.packing else ""
    packed += ", padding-free batches" if free and not cfg.packing else ""
    note = f"train: {stats.line()}{packed}; eval: {eval_stats.line()}; {template}"
    return PreparedData(
        tokenizer=tok,
        train=train_rows,  # type: ignore[arg-type]
        val=val_rows,  # type: ignore[arg-type]
        n_documents=len(rows),
        n_tokens=stats.tokens,
        describe=note,
        chat=stats,
        eval_chat=eval_stats,
    )
