"""`stackwise eval`: a deterministic likelihood, a conditional likelihood that never masks the
prompt, sample statistics on known text, and the CLI end to end with a causal reference."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from stackwise.cli import main
from stackwise.evaluate import (
    masked_nll_sums,
    t_grid,
    unigram_entropy,
    word_stats,
)
from stackwise.objectives.schedules import Linear
from stackwise.pipeline import train_from_config

MASK, V = 0, 16


class Uniform(nn.Module):
    """Predicts every token with probability 1/V, and records what it was shown."""

    uses_time = True

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, attention_mask=None, t=None) -> torch.Tensor:
        self.inputs.append(x.clone())
        return torch.zeros(*x.shape, V)


def test_t_grid_is_the_midpoints_of_equal_cells():
    g = t_grid(4, 0.0)
    assert torch.allclose(g, torch.tensor([0.125, 0.375, 0.625, 0.875], dtype=torch.float64))
    assert torch.equal(t_grid(16, 1e-3), t_grid(16, 1e-3))


def test_grid_nelbo_of_a_uniform_model_is_length_times_log_v():
    ids = torch.randint(1, V, (8, 64), generator=torch.Generator().manual_seed(0))
    all_real = torch.ones_like(ids, dtype=torch.bool)
    rack = Uniform()
    got = masked_nll_sums(rack, ids, all_real, Linear(), t_grid(32, 1e-3), MASK, seed=0)
    # E[w(t) * #masked * ln V] = (1/t) * t * L * ln V for every t
    assert torch.allclose(got, torch.full((8,), 64 * math.log(V), dtype=torch.float64), rtol=0.1)
    again = masked_nll_sums(Uniform(), ids, all_real, Linear(), t_grid(32, 1e-3), MASK, seed=0)
    assert torch.equal(got, again)  # fixed masks: the same number every time


def test_conditional_estimate_never_masks_the_prompt():
    ids = torch.randint(1, V, (4, 32), generator=torch.Generator().manual_seed(1))
    cont = torch.zeros_like(ids, dtype=torch.bool)
    cont[:, 16:] = True
    rack = Uniform()
    masked_nll_sums(rack, ids, cont, Linear(), torch.tensor([0.5, 0.9, 0.99]), MASK, seed=0)
    for x in rack.inputs:
        assert torch.equal(x[:, :16], ids[:, :16])
        assert bool((x[:, 16:] == MASK).any())


def test_conditional_noise_levels_fill_every_cell_once():
    from stackwise.evaluate import stratified_ts

    ts = stratified_ts(8, 0.01, torch.arange(400), seed=3)
    assert ts.shape == (8, 400)
    cells = ((ts - 0.01) / 0.99 * 8).floor().long()
    assert bool((cells == torch.arange(8)[:, None]).all())  # each block: one draw per cell
    assert ts.mean().item() == pytest.approx(0.505, abs=0.01)  # unbiased: uniform on average
    assert ts[0].std().item() > 0.03  # the blocks' offsets differ
    again = stratified_ts(8, 0.01, torch.arange(5, 10), seed=3)
    assert torch.equal(again, ts[:, 5:10])  # seeded per block, not per batch


def test_word_statistics_on_known_text():
    stats = word_stats(["\nthe king the king the the the queen."], {"the", "king"})
    assert stats["words"] == 8
    assert stats["in_corpus"] == pytest.approx(7 / 8)
    cut = word_stats(["ngdom the kin", "queen"], {"the"})  # fragments at the sample's ends
    assert cut["words"] == 4 and cut["whole_words"] == 1 and cut["in_corpus"] == 1.0
    apart = word_stats([" the king", "king the "], set())  # n-grams and runs stay in a sample
    assert apart["longest_repeat_run"] == 1 and apart["distinct_2"] == 1.0
    assert stats["longest_repeat_run"] == 3
    assert stats["repeat_rate"] == pytest.approx(2 / 7)  # "the the" twice among 7 pairs
    assert stats["distinct_2"] == pytest.approx(4 / 7)  # the king / king the / the the / the queen
    assert unigram_entropy([[1, 1, 2, 2]]) == pytest.approx(math.log(2))
    assert unigram_entropy([[3, 3, 3]]) == 0.0


def test_eval_cli_writes_eval_json_with_a_causal_reference(tiny, tmp_path, capsys):
    diff = train_from_config(
        tiny(
            objective={"name": "diffusion"},
            train={"max_steps": 2, "output_dir": str(tmp_path / "d")},
        ),
        quiet=True,
    )
    ref = train_from_config(
        tiny(objective={"name": "clm"}, train={"max_steps": 2, "output_dir": str(tmp_path / "c")}),
        quiet=True,
    )
    args = ["eval", "--checkpoint", str(diff.output_dir), "--reference", str(ref.output_dir)]
    args += ["--samples", "2", "--t-points", "4", "--mc-num", "2", "--max-blocks", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "bits/char" in printed and "gen PPL" in printed
    report = json.loads((diff.output_dir / "eval.json").read_text())
    lk = report["likelihood"]
    assert lk["bpc"] > 0 and lk["nelbo_per_token"] > 0 and lk["blocks"] == 4
    assert report["samples"]["gen_ppl"] > 1
    assert main(args) == 0  # deterministic: the same likelihood again
    assert json.loads((diff.output_dir / "eval.json").read_text())["likelihood"] == lk
    # the causal run: exact NLL
    assert (
        main(["eval", "--checkpoint", str(ref.output_dir), "--samples", "1", "--max-blocks", "2"])
        == 0
    )
    assert "exact NLL" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(ref.output_dir), "--samples", "0"]) == 2
    # the NELBO's flags on the causal run: refused, not ignored
    causal = ["eval", "--checkpoint", str(ref.output_dir), "--samples", "1", "--max-blocks", "2"]
    kept = (ref.output_dir / "eval.json").read_text()
    assert main([*causal, "--t-points", "3", "--mc-num", "2"]) == 2
    said = capsys.readouterr().err
    assert "--t-points and --mc-num set how a masked" in said and "Traceback" not in said
    assert (ref.output_dir / "eval.json").read_text() == kept  # the earlier report stays


def test_eval_masks_do_not_depend_on_how_blocks_are_batched():
    ids = torch.randint(1, V, (6, 32), generator=torch.Generator().manual_seed(2))
    real = torch.ones_like(ids, dtype=torch.bool)
    ts = t_grid(4, 1e-3)
    whole = masked_nll_sums(Uniform(), ids, real, Linear(), ts, MASK, seed=0)
    parts = [
        masked_nll_sums(Uniform(), ids[a:b], real[a:b], Linear(), ts, MASK, 0, torch.arange(a, b))
        for a, b in ((0, 4), (4, 6))
    ]
    assert torch.equal(whole, torch.cat(parts))


def test_the_eval_flags_default_to_the_settings_defaults():
    """The parser repeats EvalSettings' defaults (importing them would load torch for --help):
    masked_only compares against them, so they must not drift apart."""
    from stackwise.cli.parsers import build_parser
    from stackwise.evaluate.settings import EvalSettings

    ns = build_parser().parse_args(["eval", "--checkpoint", "RUN"])
    given = EvalSettings(ns.t_points, ns.mc_num, ns.samples, ns.max_blocks, ns.seed)
    assert given == EvalSettings() and given.masked_only() == []
