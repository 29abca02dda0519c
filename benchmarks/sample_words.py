"""How sampler settings trade corpus words against repetition, on one trained masked run.

Run from the repository root on a trained run (for example the default `make train`):

    .venv/bin/python benchmarks/sample_words.py --checkpoint outputs/<run> [--seeds 1,2,3]
        [--samples 32] [SETTING ...]

A SETTING is a JSON object of `sample.*` overrides, e.g. '{"block_length": 16}'; without any, a
grid around the run's own settings is measured. Each row draws `--samples` samples per seed and
reports what `stackwise eval` reports: the share of whole sampled words found in the corpus (the
documents' words, not the training windows', which would count fragments cut at window edges),
the share of adjacent word pairs that repeat, samples holding such a pair, and distinct-2. The
last line is the headline: the run's own settings' corpus-word share.
"""

from __future__ import annotations

import argparse
import itertools
import json

import _record as record
import torch

from stackwise.config import derive
from stackwise.data.sources import load_documents
from stackwise.evaluate import WORD, corpus_vocabulary, word_stats
from stackwise.generate import generate
from stackwise.runs import config_of, load_trained

GRID = [
    {},
    {"no_repeat_words": False},
    {"temperature": 1.0},
    {"temperature": 1.0, "no_repeat_words": False},
    {"block_length": 16},
    {"block_length": 0},
    {"sampler": "ancestral", "temperature": 0.5, "block_length": 16, "steps": 256},
]


def share_with_repeat(texts: list[str]) -> float:
    def repeats(text: str) -> bool:
        words = [w.lower() for w in WORD.findall(text)]
        return any(a == b for a, b in itertools.pairwise(words))

    return sum(map(repeats, texts)) / len(texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("settings", nargs="*", help="JSON objects of sample.* overrides")
    record.add_flag(ap)
    args = ap.parse_args()
    rec = record.start("sample_words", args.record)
    torch.set_num_threads(2)
    plan, rack, tok = load_trained(args.checkpoint)
    vocabulary = corpus_vocabulary([text for _, text in load_documents(plan.data)])
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = [json.loads(s) for s in args.settings] or GRID
    config = config_of(plan)  # generate takes its settings as checked: check each row first
    for overrides in grid:
        if overrides:
            derive(config, {f"sample.{k}": v for k, v in overrides.items()}, "a SETTING")
    labels = [json.dumps(o) if o else "(the run's settings)" for o in grid]
    width = max(len(label) for label in [*labels, "overrides of the run sample.*"])
    print(f"{'overrides of the run sample.*':<{width}} {'words':>6} {'pairs':>6} {'w/ pair':>7} d2")
    own = None
    for overrides, label in zip(grid, labels, strict=True):
        texts = []
        for seed in seeds:
            texts += generate(plan, rack, tok, n=args.samples, seed=seed, **overrides).texts
        stats = word_stats(texts, vocabulary)
        print(
            f"{label:<{width}} {stats['in_corpus']:>6.1%} {stats['repeat_rate']:>6.2%} "
            f"{share_with_repeat(texts):>7.0%} {stats['distinct_2']:.2f}",
            flush=True,
        )
        if not overrides:
            own = stats["in_corpus"]
    if own is not None:
        print(f"headline: the run's own sampler puts {own:.1%} of its whole words in the corpus")
    rec.finish("≥ 80% of whole words in the corpus", None if own is None else own >= 0.8)


if __name__ == "__main__":
    main()
