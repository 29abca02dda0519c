"""RMSNorm and silu(gate) * up keeping fewer tensors for backward: the same outputs and
gradients as the plain ops, less memory kept, and the plain ops where the lean ones step aside."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import stackwise.model.layers as layers
import stackwise.model.lean_autograd as lean
import stackwise.model.moe as moe
from stackwise.config import ModelConfig
from stackwise.model import Rack, SwiGLU
from stackwise.model.moe import MoEFeedForward

V = 50


def plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def plain_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def plain_path(out: torch.Tensor) -> bool:
    return type(out.grad_fn).__name__ not in ("_RMSNormBackward", "_SiluMulBackward")


def test_backward_formulas_pass_gradcheck():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: lean.rms_norm(a, b, 1e-5), (x, w))
    gate = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lean.silu_mul, (gate, up))


@pytest.mark.parametrize("grads", [(True, True), (True, False), (False, True)])
def test_outputs_equal_and_gradients_match_the_plain_ops(grads):
    torch.manual_seed(1)
    x = torch.randn(5, 7, 32).requires_grad_(grads[0])
    w = (torch.rand(32) + 0.5).requires_grad_(grads[1])
    gate = torch.randn(5, 7, 24).requires_grad_(grads[0])
    up = torch.randn(5, 7, 24).requires_grad_(grads[1])
    for ours, plain, args in (
        (lean.rms_norm, plain_rms_norm, (x, w, 1e-5)),
        (lean.silu_mul, plain_silu_mul, (gate, up)),
    ):
        out = ours(*args)
        assert not plain_path(out)
        assert torch.equal(out, plain(*args))  # the forward is the same op: bit for bit
        g = torch.randn_like(out)
        inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        got = torch.autograd.grad(out, inputs, g)
        want = torch.autograd.grad(plain(*args), inputs, g)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def small_rack(**kw) -> Rack:
    torch.manual_seed(0)
    spec = {"d_model": 32, "n_heads": 4, "n_stacks": 2, "blocks_per_stack": 2, "max_seq_len": 16}
    return Rack(ModelConfig(**{**spec, **kw}), V, True)


def use_plain_ops(monkeypatch) -> None:
    monkeypatch.setattr(layers, "rms_norm", plain_rms_norm)
    monkeypatch.setattr(layers, "silu_mul", plain_silu_mul)
    monkeypatch.setattr(moe, "silu_mul", plain_silu_mul)


def gradients(model: torch.nn.Module, loss) -> list[torch.Tensor]:
    model.zero_grad()
    loss().backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_rack_keeps_one_tensor_less_per_norm_and_per_swiglu(monkeypatch):
    ids = torch.randint(0, V, (3, 16))
    model = small_rack()

    def step() -> torch.Tensor:
        return model(ids).sum()

    leaner = lean.kept_for_backward(model, step)
    use_plain_ops(monkeypatch)
    plain = lean.kept_for_backward(model, step)
    blocks, tokens, d = 4, 3 * 16, 32
    norms = 2 * blocks + 1  # two per block and the final one
    ffn = model.stacks[0].blocks[0].ffn.gate_proj.out_features
    assert plain - leaner == 4 * tokens * (norms * d + blocks * ffn)


@pytest.mark.parametrize(
    "kw",
    [{"n_kv_heads": 2}, {"gradient_checkpointing": True}],
    ids=["gqa", "checkpointed"],
)
def test_the_rack_trains_to_the_same_gradients_within_1e_5(monkeypatch, kw):
    ids = torch.randint(0, V, (2, 16))
    model = small_rack(**kw).train()

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())

    ours = gradients(model, loss)
    use_plain_ops(monkeypatch)
    for a, b in zip(ours, gradients(model, loss), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_moe_experts_and_a_fused_swiglu_under_autocast_match_the_plain_ops(monkeypatch):
    """Experts take the lean product too; under autocast gate and up are the two halves of one
    joint bf16 output (views, not contiguous), and the gradients are the plain ops' exactly."""
    torch.manual_seed(2)
    x = torch.randn(3, 10, 32)
    experts = MoEFeedForward(32, 24, num_experts=3, top_k=2)
    swiglu = SwiGLU(small_rack().cfg)

    def routed() -> torch.Tensor:
        return experts(x).square().mean()

    def fused() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return swiglu(x).float().square().mean()

    joint, real = [], layers.joint_linear
    monkeypatch.setattr(layers, "joint_linear", lambda x, *ls: joint.append(ls) or real(x, *ls))
    ours = gradients(experts, routed), gradients(swiglu, fused)
    assert len(joint) == 1 and len(joint[0]) == 2  # gate and up: halves of one matmul's output
    use_plain_ops(monkeypatch)
    for a, b in zip(ours[0], gradients(experts, routed), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(ours[1], gradients(swiglu, fused), strict=True):
        assert torch.equal(a, b)


def test_non_contiguous_inputs_torch_func_and_double_backward():
    x = torch.randn(4, 16, 6).transpose(1, 2)  # (4, 6, 16), strided
    w = torch.rand(16) + 0.5
    want = torch.func.grad(lambda a: plain_rms_norm(a, w, 1e-5).square().sum())(x)
    got = torch.func.grad(lambda a: lean.rms_norm(a, w, 1e-5).square().sum())(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    gate, up, v = torch.randn(2, 3, 5), torch.randn(2, 3, 5), w[:5]  # jacrev: vmaps grad alone
    jacobians = [
        torch.func.jacrev(f)(gate)
        for f in (
            lambda a: lean.rms_norm(a, v, 1e-5),
            lambda a: plain_rms_norm(a, v, 1e-5),
            lambda a: lean.silu_mul(a, up),
            lambda a: plain_silu_mul(a, up),
        )
    ]
    torch.testing.assert_close(jacobians[0], jacobians[1])
    torch.testing.assert_close(jacobians[2], jacobians[3])
    # jacrev over the other arguments (it batches the incoming gradient)
    for ours, plain, args, at in (
        (lean.silu_mul, plain_silu_mul, (gate, up), 1),
        (lean.silu_mul, plain_silu_mul, (gate, up), (0, 1)),
        (lean.rms_norm, plain_rms_norm, (gate, v, 1e-5), (0, 1)),
    ):
        torch.testing.assert_close(
            torch.func.jacrev(ours, argnums=at)(*args), torch.func.jacrev(plain, argnums=at)(*args)
        )
    with warnings.catch_warnings():  # per-sample gradients, by batching rules (no slow fallback)
        warnings.simplefilter("error")
        per_sample = torch.func.vmap(torch.func.grad(lambda a: lean.rms_norm(a, v, 1e-5).sum()))
        want = torch.func.vmap(torch.func.grad(lambda a: plain_rms_norm(a, v, 1e-5).sum()))
        torch.testing.assert_close(per_sample(gate), want(gate))
    x.requires_grad_()
    (first,) = torch.autograd.grad(lean.rms_norm(x, w, 1e-5).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        first.sum().backward()


def test_the_plain_ops_run_where_the_lean_ones_step_aside(monkeypatch):
    x, w = torch.randn(2, 3, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    assert not plain_path(lean.rms_norm(x, w, 1e-5)) and not plain_path(lean.silu_mul(x, x))
    # bf16 norms compute in fp32 inside the plain op; another device (CUDA) has a fused kernel
    assert plain_path(lean.rms_norm(x.bfloat16(), w.bfloat16(), 1e-5))
    meta = torch.randn(2, 3, 8, device="meta", requires_grad=True)
    assert plain_path(lean.rms_norm(meta, torch.ones(8, device="meta", requires_grad=True), 1e-5))
    with torch.no_grad():  # nothing kept anyway: no Function in the way
        assert lean.rms_norm(x, w, 1e-5).grad_fn is None and lean.silu_mul(x, x).grad_fn is None
    assert plain_path(lean.rms_norm(x.detach(), w.detach(), 1e-5))
    assert plain_path(lean.silu_mul(x, x[:, :1]))  # broadcasting: the plain ops
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # inductor chooses itself
    assert plain_path(lean.rms_norm(x, w, 1e-5)) and plain_path(lean.silu_mul(x, x))


def test_vmap_over_the_norm_weight_or_up_alone_runs_the_lean_functions(monkeypatch):
    """Forward and backward batched over an argument the incoming gradient does not share:
    out-of-place ops only (an in-place op on the unbatched tensor fails under vmap)."""
    calls = []
    for function in (lean._RMSNorm, lean._SiluMul):
        real = function.apply
        monkeypatch.setattr(function, "apply", lambda *a, real=real: calls.append(1) or real(*a))
    x, gate = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    weights, ups = torch.rand(4, 5) + 0.5, torch.randn(4, 2, 3, 5)
    cotangent = torch.randn(2, 3, 5)
    for ours, plain, batched in (
        (lambda w: lean.rms_norm(x, w, 1e-5), lambda w: plain_rms_norm(x, w, 1e-5), weights),
        (lambda u: lean.silu_mul(gate, u), lambda u: plain_silu_mul(gate, u), ups),
    ):
        for transform in (
            lambda f: torch.func.grad(lambda a: f(a).square().sum()),
            lambda f: lambda a: torch.func.vjp(f, a)[1](cotangent)[0],
        ):
            got = torch.func.vmap(transform(ours))(batched)
            torch.testing.assert_close(got, torch.func.vmap(transform(plain))(batched))
    assert len(calls) == 4  # each lean Function ran, once per transform
