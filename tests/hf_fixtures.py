"""Tiny Hugging Face causal LMs and chat files for the fine-tuning tests (built, saved, loaded
from a temporary folder: no hub)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "sun",
    "moon",
    "star",
]


def tiny_hf(
    folder: Path, kind: str = "llama", tied: bool = True, template: str | None = None
) -> Path:
    """A 2-layer model of `kind` (a transformers model_type: llama, qwen2, mistral, ...) with a
    byte-level tokenizer, saved to folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from stackwise.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer().to_transformers()  # a model's folder, as transformers saves it
    if template is not None:
        tok.chat_template = template
    shape: dict[str, Any] = {
        "vocab_size": len(tok) + 4,  # room: a Qwen2 tokenizer class adds a token on load
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": tied,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **shape)).save_pretrained(
        str(folder)
    )
    tok.save_pretrained(str(folder))
    return folder


def chat_file(path: Path, n: int = 24, seed: int = 0, fmt: str = "messages") -> Path:
    """Conversations of varying length: 'Repeat: <words>' answered with the words."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10)))
            row: dict[str, Any]
            if fmt == "messages":
                row = {
                    "messages": [
                        {"role": "user", "content": f"Repeat: {q}"},
                        {"role": "assistant", "content": q},
                    ]
                }
            else:
                row = {"prompt": f"Repeat: {q}", "completion": q}
            fh.write(json.dumps(row) + "\n")
    return path


def hf_config(model_dir: Path, data_file: Path, out: Path, **sections: dict) -> Any:
    from stackwise.config import from_dict

    base: dict[str, Any] = {
        "model": {"source": "hf", "model_name_or_path": str(model_dir)},
        "data": {"mode": "instruction", "files": [str(data_file)], "seq_len": 96},
        "lora": {"enabled": True, "rank": 4, "alpha": 8.0},
        "train": {
            "max_steps": 4,
            "batch_size": 4,
            "lr": 3e-3,
            "eval_every": 2,
            "eval_batches": 2,
            "output_dir": str(out),
            "mixed_precision": "no",
        },
        "logging": {"tensorboard": False, "console": False, "progress_bar": "never"},
        "sample": {"num_samples": 0},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return from_dict(base)
