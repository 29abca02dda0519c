"""`stackwise eval`: numbers two runs can be compared by, without training noise or luck.

- Likelihood on the validation split: for diffusion racks the NELBO on a fixed midpoint grid of
  t (the same masks every time, so two runs differ only by their weights); for causal racks the
  exact NLL. Both per token and in bits per character.
- Conditional likelihood of each validation block's second half given its first half (the
  prompt is never masked): Monte-Carlo over `mc_num` stratified noise levels for masked racks,
  exact for causal ones. This is what multiple-choice evals score.
- Samples: generative perplexity under a reference causal rack, unigram entropy, distinct
  2/3-grams of words, the share of sampled (whole) words found in the training corpus, sampler
  speed (tokens/s, forward passes per sample).

The measures live in `likelihood` and `samples`; this module runs them on one run folder and
renders the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackwise.config import derive
from stackwise.errors import StackWiseError
from stackwise.evaluate.likelihood import (
    causal_nll_sums,
    conditional_likelihood,
    likelihood,
    masked_nll_sums,
    stratified_ts,
    t_grid,
)
from stackwise.evaluate.samples import (
    WORD,
    corpus_vocabulary,
    generative_perplexity,
    sample_quality,
    unigram_entropy,
    word_stats,
)
from stackwise.evaluate.settings import EvalSettings
from stackwise.io.run_folder import run_folder_of
from stackwise.io.trained import training_compute
from stackwise.runs import config_of, load_trained
from stackwise.spec import Plan

__all__ = [
    "WORD",
    "EvalSettings",
    "causal_nll_sums",
    "conditional_likelihood",
    "corpus_vocabulary",
    "generative_perplexity",
    "likelihood",
    "masked_nll_sums",
    "reference_rack",
    "render",
    "run_eval",
    "sample_quality",
    "stratified_ts",
    "t_grid",
    "unigram_entropy",
    "word_stats",
]


def reference_rack(reference: str | Path) -> tuple[Plan, Any, Any]:
    """The run that scores the samples, checked before any scoring: it must be causal."""
    try:
        loaded = load_trained(reference)
    except StackWiseError as err:  # say which of the two runs it is about
        raise StackWiseError(f"--reference: {err}") from None
    if not loaded[0].objective.causal:
        raise StackWiseError(
            f"--reference '{reference}' is a {loaded[0].objective.name} run, but generative "
            "perplexity scores samples left to right, which only a causal run (objective clm) "
            "can do. Pass a run trained with objective.name: clm, or leave out --reference."
        )
    return loaded


# what tells one sampler's eval from another's (eval_samplers.json keeps one row per setting)
SAMPLER_SETTINGS = (
    "sampler",
    "steps",
    "remasking",
    "block_length",
    "temperature",
    "confidence_threshold",
    "remask_budget",
)


def run_eval(
    folder: str | Path,
    settings: EvalSettings,
    reference: str | Path | None = None,
    **sampling: Any,
) -> dict[str, Any]:
    """Everything above for the run in `folder`; written to `folder/eval.json` by the CLI."""
    from stackwise.data.documents import Corpus
    from stackwise.data.pack import build_data

    ref = reference_rack(reference) if reference is not None else None  # first: fails fast
    config, rack, tokenizer = load_trained(folder)
    if config.objective.causal and (unused := settings.masked_only()):
        raise StackWiseError(
            f"{' and '.join(unused)} set how a masked (mlm/diffusion) rack's NELBO is "
            f"estimated, and '{folder}' is causal ({config.objective.name}): its likelihood "
            f"is exact, so they would change nothing. Leave out {' and '.join(unused)}."
        )
    changes = {f"sample.{k}": v for k, v in sampling.items() if v is not None}
    sample = config.sample
    if changes:  # checked by every rule before any scoring (generate takes them as checked)
        sample = derive(config_of(config), changes, "the sampling settings").sample
    data = build_data(config.data)
    if len(data.tokenizer) != len(tokenizer) or data.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise StackWiseError(
            f"The data of '{folder}' no longer tokenizes as it did in training (its corpus or "
            "tokenizer changed). Evaluate on the same data the run used."
        )
    if config.data.streaming:  # a stream is not read whole: the validation blocks' words
        texts: Any = (tokenizer.decode(row, skip_special_tokens=True) for row in data.val.blocks)
    else:
        texts = Corpus(config.data)  # a megabyte at a time
    vocabulary = corpus_vocabulary(texts)
    return {
        "run": str(folder),
        "objective": config.objective.name,
        "training": training_compute(run_folder_of(Path(folder).expanduser())[0]),
        "likelihood": likelihood(config, rack, data, settings),
        "conditional": conditional_likelihood(config, rack, data, settings),
        "samples": sample_quality(config, rack, data, vocabulary, settings, ref, **sampling),
        "sampling": {k: getattr(sample, k) for k in SAMPLER_SETTINGS},
        "reference": str(reference) if reference is not None else None,
    }


def render(report: dict[str, Any]) -> str:
    lk, cond, smp = report["likelihood"], report["conditional"], report["samples"]
    per_tok = next(v for k, v in lk.items() if k.endswith("_per_token"))
    rows = [
        ("val likelihood", f"{lk['kind']} over {lk['blocks']} blocks"),
        ("  nats/token", f"{per_tok:.4f}"),
        ("  bits/char", f"{lk['bpc']:.4f}" if "bpc" in lk else "-"),
        ("conditional (2nd half | 1st)", cond["estimate"]),
        ("  nats/token", f"{cond['nats_per_token']:.4f}"),
        ("  bits/char", f"{cond['bpc']:.4f}" if "bpc" in cond else "-"),
        ("samples", str(smp["samples"])),
        ("  gen PPL (reference)", f"{smp['gen_ppl']:.2f}" if "gen_ppl" in smp else "-"),
        ("  unigram entropy", f"{smp['entropy']:.3f} (val text: {smp['corpus_entropy']:.3f})"),
        ("  distinct-2 / -3", f"{smp['distinct_2']:.3f} / {smp['distinct_3']:.3f}"),
        ("  words in corpus", f"{100 * smp['in_corpus']:.1f}% of {int(smp['whole_words'])} whole"),
        ("  longest repeated-word run", f"{int(smp['longest_repeat_run'])}"),
        (
            "  repeated-word pairs",
            f"{100 * smp['repeat_rate']:.2f}% (val text: {100 * smp['corpus_repeat_rate']:.2f}%)",
        ),
        ("  sampler speed", f"{smp['tokens_per_s']:.0f} tokens/s"),
        ("  forward passes / sample", f"{smp['forward_passes_per_sample']}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append(f"example: {smp['example'].strip()[:200]!r}")
    return "\n".join(lines)
