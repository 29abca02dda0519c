"""Shared fixtures: offline hubs, a small generated corpus, and a tiny config builder."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: one thread per worker and its children
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from stackwise.config import Config, from_dict

torch.set_num_threads(
    1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1))
)

# The files whose processes take a minute or more, longest first. `make test` runs
# pytest-xdist with `--dist loadfile --no-loadscope-reorder`, which hands files to the two
# workers in collection order (by default it hands out the files with the most tests first,
# and a one-test file of a minute, test_kill.py, ran last on one worker while the other had
# finished). Starting these first lets the short files fill in at the end.
LONG_FILES = (
    "test_deepspeed.py",
    "test_fsdp_qlora.py",
    "test_fsdp.py",
    "test_cli.py",
    "test_distributed.py",
    "test_interrupts.py",
    "test_fields_read.py",
    "test_kill.py",
    "test_cli_progressive.py",
    "test_fsdp_growth.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def position(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)

    items.sort(key=position)  # stable: each file's tests keep their order


WORDS = [
    "the",
    "king",
    "queen",
    "lord",
    "lady",
    "speak",
    "night",
    "day",
    "love",
    "death",
    "crown",
    "sword",
    "wine",
    "bread",
    "city",
    "river",
    "hath",
    "thou",
    "thee",
    "doth",
    "shall",
    "never",
    "ever",
    "sweet",
    "bitter",
    "fair",
    "foul",
    "heart",
    "mind",
    "soul",
    "truth",
    "lie",
]


def make_corpus(n_lines: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 12)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(make_corpus(), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stackwise-cache")


def tiny_dict(corpus: Path, cache: Path, out: Path, **sections: dict[str, Any]) -> dict:
    """A config dict for a seconds-long run; `sections` update it section by section."""
    base: dict[str, dict[str, Any]] = {
        "model": {
            "d_model": 32,
            "n_heads": 2,
            "n_stacks": 1,
            "blocks_per_stack": 2,
            "max_seq_len": 32,
        },
        "data": {
            "source": "files",
            "files": [str(corpus)],
            "seq_len": 32,
            "bpe_vocab_size": 300,
            "cache_dir": str(cache),
        },
        "train": {
            "max_steps": 4,
            "batch_size": 4,
            "eval_every": 2,
            "eval_batches": 2,
            "output_dir": str(out),
            "mixed_precision": "no",
        },
        "logging": {
            "log_every": 2,
            "console": False,
            "tensorboard": False,
            "progress_bar": "never",
        },
        "sample": {"num_samples": 1, "max_new_tokens": 8},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    if base["data"].get("tokenizer") in ("char", "byte"):
        base["data"].pop("bpe_vocab_size")  # only the BPE reads it
    if base.get("objective", {}).get("name") in ("mlm", "diffusion", "block_diffusion"):
        base["sample"].setdefault("steps", 4)  # only masked racks take denoising steps
    return base


@pytest.fixture
def tiny(corpus_file: Path, cache_dir: Path, tmp_path: Path):
    """tiny(**sections) -> Config for a seconds-long run writing into tmp_path/run."""

    def build(**sections: dict[str, Any]) -> Config:
        return from_dict(tiny_dict(corpus_file, cache_dir, tmp_path / "run", **sections))

    return build


@pytest.fixture(params=["avx512bf16", "plain"])
def bnb_cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force bitsandbytes' CPU path: `avx512bf16` is the one it picks on CPUs with AVX512-BF16
    (it repacks 4-bit weights in eval), `plain` the one it picks on AVX2. Linear4bit reads the
    flag when built, so every layer made inside the test takes the forced path."""
    import bitsandbytes.nn.modules as bnb_modules

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: request.param == "avx512bf16")
    return request.param


@pytest.fixture
def bf16_autocast() -> None:
    """Skip where the probe (this CPU's, or one forced by STACKWISE_BF16_PROBE) found bf16
    matmuls trapping under every oneDNN cap: training refuses mixed_precision=bf16 there."""
    from stackwise.hwprobe import ensure_bf16_ready

    verdict = ensure_bf16_ready()
    if not verdict.works:
        pytest.skip(f"bf16 autocast cannot run here: {verdict.summary()}")
