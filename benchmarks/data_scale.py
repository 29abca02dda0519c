"""Data at scale: the token store's build speed and memory, and the warm start, as the corpus
grows from the default corpus (about 5 MB) to 10x and 100x copies of it.

Each copy holds the default corpus's files with their lines shuffled (a seeded shuffle per
copy), so the BPE sees the same words in new orders and cannot memorize whole files. For each
size, in fresh processes (peak RSS is that process's own):
- build: a cold cache; the byte-level BPE (2,048 tokens) is trained (on about 64 MB, one piece
  in k, when the corpus is larger: data.bpe_sample_mb's default) and the store written. Its
  speed is corpus MB per second of the whole build (BPE training included);
- train: `stackwise train` for 10 steps of the tiny clm preset on the warm store, timed from
  the command to its first training step (the `train/loss` row of step 1, log_every 1).
The last line compares the largest size with the smallest.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import _record as record
from _common import benchmark_parser, run_child

STEPS = 10


def make_corpus(root: Path, copies: int) -> Path:
    """The default corpus plus `copies - 1` shuffled copies of it, one folder per copy."""
    from stackwise.data.corpus import shakespeare_documents

    docs = shakespeare_documents(None)
    for c in range(copies):
        folder = root / f"copy{c:03d}"
        folder.mkdir(parents=True)
        rng = random.Random(c)
        for name, text in docs:
            lines = text.splitlines(keepends=True)
            if c:
                rng.shuffle(lines)
            (folder / name).write_text("".join(lines), encoding="utf-8")
    return root


BUILD = """
import sys
from stackwise.config import DataConfig
from stackwise.data.pack import build_data
data = build_data(DataConfig(source="files", files=[sys.argv[1]], bpe_vocab_size=2048,
                             seq_len=128, cache_dir=sys.argv[2]))
print(data.n_tokens, file=sys.stderr)
"""


def measure(root: Path, copies: int) -> dict[str, float]:
    corpus = make_corpus(root / f"corpus{copies}", copies)
    size_mb = sum(p.stat().st_size for p in corpus.rglob("*.txt")) / 1e6
    cache, out = root / f"cache{copies}", root / f"run{copies}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    pattern = str(corpus / "**" / "*.txt")
    build = [sys.executable, "-c", BUILD, pattern, str(cache)]
    _, err, build_wall, build_rss = run_child(build, env)
    n_tokens = int(err.strip().splitlines()[-1])
    cmd = [
        sys.executable, "-m", "stackwise.cli", "train", "tiny-clm",
        "data.source=files", f"data.files=[{pattern}]", f"data.cache_dir={cache}",
        f"train.max_steps={STEPS}", "train.eval_every=1000", "train.eval_batches=1",
        "logging.log_every=1", "logging.tensorboard=false", "logging.progress_bar=never",
        "sample.num_samples=0", f"train.output_dir={out}", "train.overwrite_output_dir=true",
    ]  # fmt: skip
    launched = time.time()
    _, err, _, train_rss = run_child(cmd, env)
    if "building the token store" in err:
        raise RuntimeError("the training run rebuilt the store: the benchmark measures nothing")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    first_step = next(r["time"] for r in rows if r.get("step") == 1 and "train/loss" in r)
    return {
        "mb": size_mb,
        "tokens": n_tokens,
        "build_s": build_wall,
        "build_rss": build_rss,
        "train_rss": train_rss,
        "warm_start": first_step - launched,
    }


def main() -> None:
    parser = benchmark_parser(__doc__, "1x and 3x only")
    args = parser.parse_args()
    rec = record.start("data_scale", args.record)
    sizes = (1, 3) if args.quick else (1, 10, 100)
    results = []
    with tempfile.TemporaryDirectory(prefix="sw-data-scale-") as tmp:  # about 1.5 GB at 100x
        for copies in sizes:
            results.append(measure(Path(tmp), copies))
            print(f"done {copies}x: {results[-1]}", file=sys.stderr, flush=True)
    print(
        f"{'corpus MB':>9} {'tokens':>12} {'build s':>8} {'MB/s':>6} {'build RSS MB':>12} "
        f"{'10-step RSS MB':>14} {'warm start s':>12}"
    )
    for r in results:
        print(
            f"{r['mb']:>9.0f} {r['tokens']:>12,} {r['build_s']:>8.1f} "
            f"{r['mb'] / r['build_s']:>6.1f} {r['build_rss']:>12,.0f} {r['train_rss']:>14,.0f} "
            f"{r['warm_start']:>12.1f}"
        )
    small, big = results[0], results[-1]
    print(
        f"headline: {big['mb']:.0f} MB vs {small['mb']:.0f} MB: 10-step peak RSS "
        f"{big['train_rss'] / small['train_rss']:.2f}x, build RSS "
        f"{big['build_rss'] / small['build_rss']:.2f}x, warm start {big['warm_start']:.1f} s, "
        f"build {big['mb'] / big['build_s']:.1f} MB/s (slowest size "
        f"{min(r['mb'] / r['build_s'] for r in results):.1f})"
    )
    rec.finish(
        "10-step peak RSS of the largest corpus ≤ 1.2x the smallest's; warm start ≤ 5 s; build of "
        "the largest ≥ 5 MB/s",
        big["train_rss"] <= 1.2 * small["train_rss"]
        and max(r["warm_start"] for r in results) <= 5.0
        and big["mb"] / big["build_s"] >= 5.0,
    )


if __name__ == "__main__":
    main()
