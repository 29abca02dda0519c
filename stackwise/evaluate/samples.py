"""Sample quality: what the samples' words look like (repetition, distinct n-grams, words
found in the corpus), their token entropy, their generative perplexity under a causal reference
rack, and the sampler's speed."""

from __future__ import annotations

import itertools
import math
import re
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from stackwise.data.pack import PreparedData, specials_of
from stackwise.evaluate.likelihood import causal_nll_sums
from stackwise.evaluate.settings import EvalSettings
from stackwise.generate import generate
from stackwise.spec import Plan

WORD = re.compile(r"[A-Za-z']+")


def word_stats(texts: list[str], vocabulary: set[str]) -> dict[str, float]:
    """Repetition and realness of sampled words. N-grams and runs stay inside one sample."""
    per_text = [[w.lower() for w in WORD.findall(t)] for t in texts]
    out: dict[str, float] = {"words": float(sum(map(len, per_text)))}
    for n in (2, 3):
        grams = [tuple(ws[i : i + n]) for ws in per_text for i in range(len(ws) - n + 1)]
        out[f"distinct_{n}"] = len(set(grams)) / len(grams) if grams else 0.0
    # a word touching either end of a sample may be a fragment: training windows start and end
    # mid-word, and so do samples. Realness is judged on the words whole inside the sample.
    whole = [
        m.group().lower()
        for t in texts
        for m in WORD.finditer(t)
        if m.start() > 0 and m.end() < len(t)
    ]
    out["whole_words"] = float(len(whole))
    out["in_corpus"] = sum(w in vocabulary for w in whole) / len(whole) if whole else 0.0
    pairs = [(a, b) for ws in per_text for a, b in itertools.pairwise(ws)]
    out["repeat_rate"] = sum(a == b for a, b in pairs) / len(pairs) if pairs else 0.0
    longest = 0
    for ws in per_text:
        run = 1
        for a, b in itertools.pairwise(ws):
            run = run + 1 if a == b else 1
            longest = max(longest, run)
        longest = max(longest, 1 if ws else 0)
    out["longest_repeat_run"] = float(longest)
    return out


def unigram_entropy(rows: list[list[int]]) -> float:
    """Mean over rows of the entropy (nats) of the row's token histogram, as MDLM reports."""
    values = []
    for row in rows:
        if not row:
            continue
        counts = torch.tensor(list(Counter(row).values()), dtype=torch.float64)
        p = counts / counts.sum()
        values.append(float(-(p * p.log()).sum()))
    return sum(values) / len(values) if values else 0.0


def corpus_vocabulary(data_texts: Iterable[str]) -> set[str]:
    """The corpus's words, lower-cased; pieces cut where words start lose none."""
    return {w.lower() for t in data_texts for w in WORD.findall(t)}


@torch.no_grad()
def generative_perplexity(texts: list[str], reference: tuple[Plan, Any, Any]) -> float:
    """exp(mean NLL per token) of the texts under a causal reference rack (its own tokenizer)."""
    ref_config, ref_rack, ref_tok = reference
    if not ref_config.objective.causal:
        raise ValueError("the reference rack must be causal (objective clm)")
    dev = next(ref_rack.parameters()).device
    nll = count = 0.0
    for text in texts:
        ids = [ref_tok.eos_token_id, *ref_tok(text, add_special_tokens=False)["input_ids"]]
        ids = ids[: ref_rack.cfg.max_seq_len]
        if len(ids) < 2:
            continue
        x = torch.tensor([ids], device=dev)
        nll += float(causal_nll_sums(ref_rack, x, torch.ones_like(x, dtype=torch.bool)).sum())
        count += len(ids) - 1
    return math.exp(nll / count) if count else float("nan")


def sample_quality(
    config: Plan,
    rack: torch.nn.Module,
    data: PreparedData,
    vocabulary: set[str],
    s: EvalSettings,
    reference: tuple[Plan, Any, Any] | None = None,
    **sampling: Any,
) -> dict[str, Any]:
    start = time.perf_counter()
    got = generate(config, rack, data.tokenizer, n=s.samples, seed=s.seed, **sampling)
    seconds = time.perf_counter() - start
    rows = [row[got.prompt_len :].tolist() for row in got.ids]
    specials = specials_of(data.tokenizer)
    dropped = {specials.mask_id, specials.pad_id, specials.eos_id}
    rows = [[i for i in row if i not in dropped] for row in rows]
    val_rows = [blk.tolist() for blk in data.val.blocks[: max(s.samples, 256)]]
    val_text = [data.tokenizer.decode(r, skip_special_tokens=True) for r in val_rows]
    out: dict[str, Any] = {
        "samples": s.samples,
        "entropy": unigram_entropy(rows),
        "corpus_entropy": unigram_entropy(
            [r[: max(map(len, rows), default=0)] for r in val_rows[: s.samples]]
        ),
        "corpus_repeat_rate": word_stats(val_text, vocabulary)["repeat_rate"],
        **word_stats(got.texts, vocabulary),
        "tokens_per_s": got.stats.tokens / seconds if seconds else float("nan"),
        "forward_passes_per_sample": got.stats.forward_passes,  # a batch of samples shares them
        "example": got.texts[0] if got.texts else "",
    }
    if reference is not None:
        out["gen_ppl"] = generative_perplexity(got.texts, reference)
    return out
