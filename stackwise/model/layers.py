"""Transformer building blocks: RMSNorm, RoPE, attention (MHA/GQA via SDPA), SwiGLU, Block.

Projection names follow the Llama convention (q_proj, ..., down_proj) so PEFT targets and an HF
export map one to one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from stackwise.spec import ModelSpec

Rope = tuple[Tensor, Tensor]  # (cos, sin) tables for the positions being run


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    """Precomputed RoPE tables; q and k are rotated per head (Llama's rotate-half layout)."""

    def __init__(self, head_dim: int, max_len: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, length: int) -> Rope:
        return self.cos[:length], self.sin[:length]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, L, hd)."""
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


FP32_ATTENTION_MAX_LEN = 256


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA, but in fp32 for short bf16 sequences on the CPU.

    PyTorch's CPU flash kernel is 2-3x slower in bf16 than in fp32 at short lengths (measured in
    benchmarks/throughput.py), so there the core runs in fp32 and the projections stay bf16.
    On GPUs and for long sequences the bf16 kernel is used unchanged.
    """
    if (
        q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and q.shape[-2] <= FP32_ATTENTION_MAX_LEN
    ):
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


class KVCache:
    """Keys and values of the tokens seen so far, per attention layer, for causal decoding:
    each new token then costs one position's compute instead of the whole prefix's."""

    def __init__(self) -> None:
        self.layers: dict[int, Rope] = {}
        self.length = 0  # positions already cached (the same in every layer)
        self.writing = True  # False: new keys are attended to but not kept (a reader)

    def extend(self, layer: nn.Module, k: torch.Tensor, v: torch.Tensor) -> tuple:
        past = self.layers.get(id(layer))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if self.writing:
            self.layers[id(layer)] = (k, v)
        return k, v

    def reader(self, rows: torch.Tensor | None = None) -> KVCache:
        """A view of these rows' keys that attends without keeping what it is given: block
        diffusion scores a block against the finished ones at every denoising step."""
        view = KVCache()
        view.layers = dict(self.layers)  # the tensors themselves: extend never writes to them
        if rows is not None:
            view.layers = {i: (k[rows], v[rows]) for i, (k, v) in self.layers.items()}
        view.length, view.writing = self.length, False
        return view


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, causal: bool) -> None:
        super().__init__()
        self.n_heads = spec.n_heads
        self.n_kv = spec.n_kv_heads or spec.n_heads
        self.head_dim = spec.d_model // spec.n_heads
        self.causal = causal
        self.dropout = spec.dropout
        d, hd = spec.d_model, self.head_dim
        bias = spec.attention_bias  # Qwen2-style: q, k and v carry biases, o does not
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)

    def forward(
        self, x: Tensor, rope: Rope, mask: Tensor | None, cache: KVCache | None = None
    ) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        fresh = cache is None or cache.length == 0  # queries and keys cover the same positions
        if cache is not None:
            k, v = cache.extend(self, k, v)
        out = attention_core(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=self.causal and mask is None and fresh,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv != self.n_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d, h = spec.d_model, spec.ffn_width
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)
        self.frozen_up = spec.frozen_up_proj
        if self.frozen_up:
            self.up_proj.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm layer: x + attn(norm(x)), then x + ffn(norm(x)), then the memory's gated read."""

    def __init__(self, spec: ModelSpec, causal: bool, moe: bool = False) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.attn = Attention(spec, causal)
        self.ffn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.ffn: nn.Module = moe_ffn(spec) if moe else SwiGLU(spec)
        self.drop = nn.Dropout(spec.dropout)
        self.memory: nn.Module | None = None  # a routed memory layer (model.memory.attach_memory)

    def forward(
        self, x: Tensor, rope: Rope, mask: Tensor | None, cache: KVCache | None = None
    ) -> Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), rope, mask, cache))
        x = x + self.drop(self.ffn(self.ffn_norm(x)))
        return x if self.memory is None else self.memory(x)


class Stack(nn.Module):
    """`blocks_per_stack` Blocks: the unit that is grown, frozen, cached and saved."""

    def __init__(
        self, spec: ModelSpec, causal: bool, n_blocks: int | None = None, index: int = 0
    ) -> None:
        """`index`: the stack's growth index, which says whether it is an MoE stack."""
        super().__init__()
        n = n_blocks if n_blocks is not None else spec.blocks_per_stack
        self.blocks = nn.ModuleList(Block(spec, causal, spec.moe.at(index)) for _ in range(n))
        self.gradient_checkpointing = spec.gradient_checkpointing
        self.fast: Any = None  # train.compile: a compiled run_block, shared by every stack

    def forward(
        self, x: Tensor, rope: Rope, mask: Tensor | None, cache: KVCache | None = None
    ) -> Tensor:
        # the norms carry the stack's storage dtype (linears may be quantized or LoRA-wrapped)
        dtype = self.blocks[0].attn_norm.weight.dtype if len(self.blocks) else x.dtype
        if dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            # a stack stored in another precision (new_stack_precision: bf16) runs in it
            return self._run(x.to(dtype), rope, mask, cache).to(x.dtype)
        return self._run(x, rope, mask, cache)

    def _run(
        self, x: Tensor, rope: Rope, mask: Tensor | None, cache: KVCache | None = None
    ) -> Tensor:
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, mask, use_reentrant=False)
            elif self.fast is not None and cache is None:
                x = self.fast(block, x, rope, mask)
            else:
                x = block(x, rope, mask, cache)
        return x


def moe_ffn(spec: ModelSpec) -> nn.Module:
    from stackwise.model.moe import MoEFeedForward

    m = spec.moe
    hidden = m.expert_hidden or spec.ffn_width
    return MoEFeedForward(
        spec.d_model, hidden, m.num_experts, m.top_k, m.capacity_factor, m.shared_expert,
        m.router_jitter, m.coefs(),
    )  # fmt: skip


def run_block(block: Block, x: Tensor, rope: Rope, mask: Tensor | None) -> Tensor:
    return block(x, rope, mask)


def compile_blocks(model: nn.Module, on: bool = True) -> int:
    """train.compile, regionally: one compiled run_block serves every Block of every Stack
    (blocks share their code, so it compiles once per input shape, in seconds). Decoding with
    a KV cache stays eager. `on=False` puts the model back to eager (after training, so that
    samples and saved runs behave as `stackwise generate` will). Returns the stacks changed."""
    fast = torch.compile(run_block) if on else None
    stacks = [m for m in model.modules() if isinstance(m, Stack)]
    for stack in stacks:
        stack.fast = fast
    return len(stacks)


def init_weights(module: nn.Module, std: float, n_layers: int, d_model: int) -> None:
    """GPT-2 style: N(0, std), residual output projections scaled by 1/sqrt(2 * layers)."""
    for name, p in module.named_parameters():
        if p.ndim < 2:
            continue
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
        elif name.endswith("up_proj.weight") and not p.requires_grad:
            nn.init.normal_(p, 0.0, 1.0 / math.sqrt(d_model))  # frozen random features
        else:
            nn.init.normal_(p, 0.0, std)
