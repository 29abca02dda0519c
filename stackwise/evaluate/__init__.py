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
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from stackwise import seeds
from stackwise.config import derive
from stackwise.data.pack import PreparedData, specials_of
from stackwise.errors import StackWiseError
from stackwise.generate import generate
from stackwise.objectives import build_objective
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.schedules import Linear, Schedule, time_for_fraction
from stackwise.runs import config_of, load_trained
from stackwise.spec import Plan

WORD = re.compile(r"[A-Za-z']+")
LN2 = math.log(2)


@dataclass(frozen=True)
class EvalSettings:
    t_points: int = 16
    mc_num: int = 8
    samples: int = 16
    max_blocks: int = 64  # validation blocks scored (all when fewer)
    seed: int = 0


def t_grid(points: int, eps: float) -> torch.Tensor:
    """Midpoints of `points` equal cells of (eps, 1]: deterministic and evenly spread."""
    return eps + (1 - eps) * (torch.arange(points, dtype=torch.float64) + 0.5) / points


def stratified_ts(points: int, eps: float, rows: torch.Tensor, seed: int) -> torch.Tensor:
    """(points, blocks): for each validation block one draw in each of `points` equal cells of
    (eps, 1], shifted by an offset seeded by (seed, block index). Unbiased like i.i.d. draws;
    the NELBO integrand climbs steeply with t, so one offset shared by every block moved an
    8-point estimate by 0.3 nats, and i.i.d. draws bunched (5 of 8 above t=0.6) by more."""
    offsets = torch.empty(len(rows), dtype=torch.float64)
    for j, row in enumerate(rows.tolist()):
        gen = torch.Generator().manual_seed(seeds.eval_offset(seed, row))
        offsets[j] = torch.rand(1, generator=gen, dtype=torch.float64)
    cells = torch.arange(points, dtype=torch.float64)[:, None]
    return eps + (1 - eps) * (cells + offsets[None]) / points


def _masks(
    rows: torch.Tensor, length: int, frac: torch.Tensor, seed: int, point: int, device: torch.device
) -> torch.Tensor:
    """One mask per validation block (masking the fraction `frac[j]` of block j), seeded by
    (seed, block index, t point): the same masks whatever the batch size or the order blocks
    are scored in."""
    out = torch.empty(len(rows), length, dtype=torch.bool)
    for j, row in enumerate(rows.tolist()):
        gen = torch.Generator().manual_seed(seeds.eval_block(seed, row, point))
        out[j] = torch.rand(length, generator=gen, dtype=torch.float64) < float(frac[j])
    return out.to(device)


def _rack_t(rack: torch.nn.Module, masked: torch.Tensor, schedule: Schedule) -> torch.Tensor | None:
    """The time input a sampler would give this input: from the fraction actually masked."""
    if not getattr(rack, "uses_time", False):
        return None
    frac = masked.float().sum(1) / masked.shape[1]
    return time_for_fraction(schedule, frac)


@torch.no_grad()
def masked_nll_sums(
    rack: torch.nn.Module,
    ids: torch.Tensor,
    scorable: torch.Tensor,
    schedule: Schedule,
    ts: torch.Tensor,
    mask_id: int,
    seed: int,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,) estimate of -log p(scorable tokens | the rest): the mean over `ts` of
    w(t) * sum of CE over the scorable positions masked at t (the NELBO integrand). `ts` is
    (points,), shared by every block, or (points, B). `rows` are the blocks' indices in the
    validation set, which seed their masks."""
    b = ids.shape[0]
    rows = torch.arange(b) if rows is None else rows
    grid = (ts[:, None] if ts.dim() == 1 else ts).expand(-1, b)
    total = torch.zeros(b, dtype=torch.float64, device=ids.device)
    for i in range(grid.shape[0]):
        tt = grid[i].float()
        frac = schedule.mask_fraction(tt)
        masked = _masks(rows, ids.shape[1], frac, seed, i, ids.device) & scorable
        inputs = torch.where(masked, mask_id, ids)
        logits = rack(inputs, t=_rack_t(rack, masked, schedule)).float()
        ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none").double()
        weight = schedule.weight(tt).double().to(ids.device)
        total += weight * (ce * masked).sum(1)
    return total / grid.shape[0]


@torch.no_grad()
def causal_nll_sums(
    rack: torch.nn.Module, ids: torch.Tensor, scorable: torch.Tensor
) -> torch.Tensor:
    """(B,) exact -log p of the scorable tokens (positions 1..), each given all before it."""
    logits = rack(ids[:, :-1]).float()
    ce = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").double()
    return (ce * scorable[:, 1:]).sum(1)


def _val_blocks(data: PreparedData, s: EvalSettings) -> torch.Tensor:
    blocks = data.val.blocks
    return blocks[: s.max_blocks].long()


def likelihood(
    config: Plan, rack: torch.nn.Module, data: PreparedData, s: EvalSettings
) -> dict[str, Any]:
    """NELBO (grid) or exact NLL over validation blocks, per token and per character."""
    ids = _val_blocks(data, s)
    table = data.val.bytes_per_token
    dev = next(rack.parameters()).device
    ids = ids.to(dev)
    real = ids != data.specials.pad_id if data.specials.pad_id is not None else ids >= 0
    nll = torch.zeros((), dtype=torch.float64)
    scored_tokens = scored_bytes = 0.0
    bs = config.train.batch_size
    sched, eps = _schedule(config, data)
    ts, mask_id = t_grid(s.t_points, eps), data.specials.mask_id
    table = table.to(dev) if table is not None else None
    for start in range(0, ids.shape[0], bs):
        chunk, ok = ids[start : start + bs], real[start : start + bs]
        if config.objective.causal:
            nll += causal_nll_sums(rack, chunk, ok).sum().cpu()
            scored = ok.clone()
            scored[:, 0] = False
        else:
            rows = torch.arange(start, start + chunk.shape[0])
            nll += masked_nll_sums(rack, chunk, ok, sched, ts, mask_id, s.seed, rows).sum().cpu()
            scored = ok
        scored_tokens += float(scored.sum())
        scored_bytes += float(table[chunk][scored].sum()) if table is not None else 0.0
    kind = "nll" if config.objective.causal else "nelbo"
    out: dict[str, Any] = {
        "kind": "exact NLL" if config.objective.causal else f"NELBO, {s.t_points}-point t grid",
        "blocks": int(ids.shape[0]),
        f"{kind}_per_token": float(nll) / max(scored_tokens, 1.0),
    }
    if scored_bytes:
        out["bpc"] = float(nll) / LN2 / scored_bytes
    return out


def _schedule(config: Plan, data: PreparedData) -> tuple[Schedule, float]:
    obj = build_objective(config, data.specials)
    if isinstance(obj, Diffusion):
        return obj.schedule, obj.eps
    return Linear(), 1e-3  # mlm racks: the linear path, as their sampler uses


def conditional_likelihood(
    config: Plan, rack: torch.nn.Module, data: PreparedData, s: EvalSettings
) -> dict[str, Any]:
    """-log p(second half | first half) per continuation token, and per character."""
    dev = next(rack.parameters()).device
    ids = _val_blocks(data, s).to(dev)
    half = ids.shape[1] // 2
    cont = torch.zeros_like(ids, dtype=torch.bool)
    cont[:, half:] = True
    table = data.val.bytes_per_token
    if config.objective.causal:
        nll = causal_nll_sums(rack, ids, cont).sum()
        how = "exact"
    else:
        sched, eps = _schedule(config, data)
        ts = stratified_ts(s.mc_num, eps, torch.arange(ids.shape[0]), s.seed)
        nll = masked_nll_sums(rack, ids, cont, sched, ts, data.specials.mask_id, s.seed).sum()
        how = f"Monte Carlo, {s.mc_num} stratified noise levels"
    n_tok = float(cont.sum())
    out: dict[str, Any] = {"estimate": how, "nats_per_token": float(nll) / n_tok}
    if table is not None:
        out["bpc"] = float(nll) / LN2 / float(table.to(dev)[ids][cont].sum())
    return out


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
    changes = {f"sample.{k}": v for k, v in sampling.items() if v is not None}
    if changes:  # checked by every rule before any scoring (generate takes them as checked)
        derive(config_of(config), changes, "the sampling settings")
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
        "likelihood": likelihood(config, rack, data, settings),
        "conditional": conditional_likelihood(config, rack, data, settings),
        "samples": sample_quality(config, rack, data, vocabulary, settings, ref, **sampling),
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
