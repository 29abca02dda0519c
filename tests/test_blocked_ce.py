"""Cross entropy a block of rows at a time (stackwise.objectives.blocked_ce): the same loss and
gradients as F.cross_entropy, less kept for backward, and the paths that take it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import stackwise.objectives.blocked_ce as blocked
from stackwise.hf.loss import target_sums
from stackwise.objectives.base import IGNORE, token_ce, weighted_ce_sum
from stackwise.pipeline import train_from_config


def problem(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[::5] = IGNORE
    weights = torch.rand(rows, generator=g) * (targets != IGNORE)
    return logits, targets, weights


def library_sum(logits, targets, weights):
    ce = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="none")
    return (ce * weights).sum()


@pytest.mark.parametrize(
    ("dtype", "rtol", "atol"), [(torch.float32, 1e-5, 1e-7), (torch.bfloat16, 1e-2, 1e-4)]
)
@pytest.mark.parametrize("rows", [1, 63, 64, 200])  # below, at and across a block
def test_loss_and_gradient_are_the_library_s(dtype, rtol, atol, rows, monkeypatch):
    monkeypatch.setattr(blocked, "BLOCK_FP32_BYTES", 64 * 97 * 4)  # blocks of 64 rows
    logits, targets, weights = problem(rows, 97, dtype)
    ours = blocked.blocked_ce_sum(logits, targets, weights)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    ref = library_sum(logits, targets, weights)
    (grad_ref,) = torch.autograd.grad(ref, logits)
    assert ours.dtype == torch.float32 and grad_ours.dtype == dtype
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-5)
    assert torch.allclose(grad_ours.float(), grad_ref.float(), rtol=rtol, atol=atol)
    assert grad_ours[targets == IGNORE].abs().sum() == 0


def test_under_autocast_it_still_computes_in_fp32():
    logits, targets, weights = problem(100, 300, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = blocked.blocked_ce_sum(logits, targets, weights)
        ref = library_sum(logits, targets, weights)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours, ref, rtol=1e-6)


def test_an_ignored_row_adds_nothing_whatever_it_holds():
    """An IGNORE row's column 0 at -inf (a forbidden token): still 0, as the library's."""
    logits, targets, weights = problem(10, 20, torch.float32)
    logits = logits.detach().clone()
    logits[:, 0] = float("-inf")
    targets[0] = IGNORE
    targets[1:] = torch.randint(1, 20, (9,))
    ours, ref = (
        blocked.blocked_ce_sum(logits, targets, weights),
        library_sum(logits, targets, weights),
    )
    assert torch.isfinite(ours) and torch.allclose(ours, ref, rtol=1e-6)


def test_weights_broadcast_and_bad_targets_are_refused():
    logits, targets, _ = problem(6, 20, torch.float32)
    rows = torch.tensor([[0.5], [2.0]])  # one weight per row of a (2, 3) batch
    ours = blocked.blocked_ce_sum(logits.view(2, 3, 20), targets.view(2, 3), rows)
    ref = library_sum(logits, targets, rows.expand(2, 3).reshape(-1))
    assert torch.allclose(ours, ref, rtol=1e-6)
    targets[1] = -1
    with pytest.raises(ValueError, match="below 0 that is not IGNORE"):
        blocked.blocked_ce_sum(logits, targets)


def test_weights_that_learn_keep_the_library_s_path(monkeypatch):
    """A learned weighting needs its gradient, which the blocked path does not give."""
    monkeypatch.setattr(blocked, "MIN_FP32_BYTES", 0)
    logits, targets, weights = problem(30, 20, torch.float32)
    assert blocked.pays(logits, weights) and blocked.pays(logits)
    learned = weights.clone().requires_grad_()
    assert not blocked.pays(logits, learned)
    weighted_ce_sum(logits, targets, learned).backward()
    assert learned.grad is not None and learned.grad.abs().sum() > 0


def test_without_weights_every_scored_position_weighs_one():
    logits, targets, _ = problem(130, 50, torch.float32)
    logits3d, targets3d = logits.detach().view(2, 65, 50), targets.view(2, 65)
    ours = blocked.blocked_ce_sum(logits3d, targets3d)
    ref = F.cross_entropy(logits.detach(), targets, ignore_index=IGNORE, reduction="sum")
    assert torch.allclose(ours, ref, rtol=1e-6)
    per_token = blocked.blocked_token_ce(logits3d, targets3d)
    assert per_token.shape == (2, 65) and torch.allclose(per_token.sum(), ref, rtol=1e-6)


def saved_bytes(loss_fn, logits, targets, weights) -> int:
    """Bytes autograd keeps for backward while loss_fn runs (views of one storage once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(logits, targets, weights)
    return sum(seen.values())


@pytest.mark.parametrize(("dtype", "most"), [(torch.float32, 1.05), (torch.bfloat16, 0.55)])
def test_it_keeps_the_logits_not_an_fp32_log_softmax(dtype, most):
    logits, targets, weights = problem(256, 512, dtype)
    ours = saved_bytes(blocked.blocked_ce_sum, logits, targets, weights)
    library = saved_bytes(library_sum, logits, targets, weights)
    fp32_size = logits.numel() * 4
    assert library >= fp32_size  # the fp32 log-probabilities
    assert ours <= most * fp32_size, (ours, library)


def test_the_loss_paths_take_it_for_large_logits_only(monkeypatch):
    logits, targets, weights = problem(70, 40, torch.float32)
    calls: list[str] = []
    real_sum, real_token = blocked.blocked_ce_sum, blocked.blocked_token_ce
    import stackwise.hf.loss as hf_loss
    import stackwise.objectives.base as base

    def spy_sum(*args, **kwargs):
        calls.append("sum")
        return real_sum(*args, **kwargs)

    def spy_token(*args, **kwargs):
        calls.append("token")
        return real_token(*args, **kwargs)

    for module in (base, hf_loss):
        monkeypatch.setattr(module, "blocked_ce_sum", spy_sum)
    monkeypatch.setattr(base, "blocked_token_ce", spy_token)
    labels = targets.view(1, -1)  # one row: its logits but the last predict labels 1..
    small = (weighted_ce_sum(logits, targets, weights), token_ce(logits.detach(), targets))
    hf_small = target_sums(logits[None], labels)[0]
    assert calls == []
    # these logits now pay (the Hugging Face loss scores all rows but the last)
    monkeypatch.setattr(blocked, "MIN_FP32_BYTES", (logits.shape[0] - 1) * logits.shape[1] * 4)
    large = (weighted_ce_sum(logits, targets, weights), token_ce(logits.detach(), targets))
    hf_large = target_sums(logits[None], labels)[0]
    assert calls == ["sum", "token", "sum"]
    assert torch.allclose(large[0], small[0], rtol=1e-6)
    assert torch.allclose(large[1], small[1], rtol=1e-6, atol=1e-6)
    assert torch.allclose(hf_large, hf_small, rtol=1e-6)


def test_a_training_run_goes_the_same_way_through_it(tiny, tmp_path, monkeypatch):
    """The whole Trainer with every loss blocked: the same losses as with the library's."""

    def losses(name: str) -> list[float]:
        cfg = tiny(train={"max_steps": 4, "eval_every": 2, "output_dir": str(tmp_path / name)})
        return [row["loss"] for row in train_from_config(cfg, quiet=True).state.history]

    plain = losses("plain")
    monkeypatch.setattr(blocked, "MIN_FP32_BYTES", 0)
    assert losses("blocked") == pytest.approx(plain, rel=1e-5)


def test_blocks_hold_a_fixed_fp32_size_and_cover_every_row():
    for rows, vocab, step in [(10, 131072, 4), (100, 32768, 16), (5, 2**21, 1), (300, 97, 5405)]:
        blocks = blocked._blocks(torch.empty(rows, vocab, dtype=torch.bfloat16, device="meta"))
        assert blocks[0] == slice(0, step)
        covered = torch.cat([torch.arange(rows)[b] for b in blocks])
        assert covered.tolist() == list(range(rows))
