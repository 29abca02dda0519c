"""Transformer building blocks: RMSNorm, attention (SDPA), SwiGLU, Block, Stack, the tied head.

Projection names follow the Llama convention (q_proj, ..., down_proj) so PEFT targets and an HF
export map one to one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from stackwise.model.fast_paths import attention_core, fusable, joint_linear, paired_rope
from stackwise.model.lean_autograd import rms_norm, silu_mul
from stackwise.model.rope import Rope, apply_rope, rope_phases, rotated_heads
from stackwise.spec import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


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
        # False where q and k are gathered shards (FSDP): the reordered copies `rotated_heads`
        # makes would be kept whole until backward, undoing part of the sharding's saving
        self.rope_pairing = True

    def forward(
        self, x: Tensor, rope: Rope, mask: Tensor | None, cache: KVCache | None = None
    ) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self.q_proj, self.k_proj, self.v_proj
        if fusable(x, q, k, v):
            heads = joint_linear(x, q, k, v).view(b, n, -1, self.head_dim).transpose(1, 2)
            qk = apply_rope(heads[:, : self.n_heads + self.n_kv], *rope)  # q and k in one pass
            q, k = qk.split([self.n_heads, self.n_kv], dim=1)
            v = heads[:, self.n_heads + self.n_kv :]
            if cache is not None:  # a cache keeps k and v: not views holding q's memory too
                k, v = k.contiguous(), v.contiguous()
        elif cache is None and self.rope_pairing and paired_rope(x, q, k):
            # (a KV cache keeps its keys in rotate-half order, so cached decoding never pairs)
            phases = rope_phases(rope, x.dtype)
            q, k = rotated_heads(x, q, self.n_heads, phases), rotated_heads(x, k, self.n_kv, phases)
            v = v(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        else:
            q = q(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
            k = k(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
            v = v(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
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
        if fusable(x, self.gate_proj, self.up_proj):
            gate, up = joint_linear(x, self.gate_proj, self.up_proj).chunk(2, dim=-1)
            return self.down_proj(silu_mul(gate, up))
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


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


class TiedHead(nn.Module):
    """The output projection that reuses the token embeddings. It owns no weights (the state
    dict is unchanged); being a module, it is seen as the linear it is (FLOP counting)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self._embedding = [embedding]  # a list: not registered a second time

    @property
    def weight(self) -> nn.Parameter:
        return self._embedding[0].weight

    @property
    def in_features(self) -> int:  # from the embedding's sizes: a partitioned weight has none
        return self._embedding[0].embedding_dim

    @property
    def out_features(self) -> int:
        return self._embedding[0].num_embeddings

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.to(h.dtype).t()


def plain_block(block: nn.Module) -> bool:
    """A dense Block whose projections are all plain nn.Linear: no LoRA or quantized layers,
    routed experts or memory. Such blocks are the ones measured compiled and counted whole."""
    if not isinstance(block, Block) or block.memory is not None:
        return False
    attn, ffn = block.attn, block.ffn
    if type(ffn) is not SwiGLU:
        return False
    projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
    projections += (ffn.gate_proj, ffn.up_proj, ffn.down_proj)
    return all(type(m) is nn.Linear for m in projections)


def moe_ffn(spec: ModelSpec) -> nn.Module:
    from stackwise.model.moe import MoEFeedForward

    m = spec.moe
    hidden = m.expert_hidden or spec.ffn_width
    return MoEFeedForward(
        spec.d_model, hidden, m.num_experts, m.top_k, m.capacity_factor, m.shared_expert,
        m.router_jitter, m.coefs(),
    )  # fmt: skip


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
