"""A routed memory layer: C chapters of learned key/value slots beside a block.

A router scores the chapters for each token (from the normalized hidden state) and keeps the
top k; the token's query attends over each chosen chapter's S slots, and the chapters' reads
are mixed by the router's (renormalized) weights. The read is added to the residual stream
through a per-channel gate that starts at zero, so inserting memory layers into a trained model
leaves its function unchanged until the gate learns to open. Chapters run batched: the tokens
are grouped by chapter (routing.grouped) and two batched matmuls score and read every chapter's
slots at once, with no Python loop; there is no capacity, so nothing is dropped. Each forward
records its routing for the router losses (routing.RoutingRecord: `last_stats`).

`attach_memory` puts one after chosen blocks of a rack; `stackwise.hf.memory` hooks them onto a
Hugging Face model's decoder layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from stackwise.model.routing import RoutingRecord, grouped, route, router_metrics
from stackwise.spec import MemorySpec


class MemoryLayer(RoutingRecord, nn.Module):
    built = 0  # layers made in this process, so runs without memory skip looking for them

    def __init__(
        self,
        d: int,
        chapters: int,
        slots: int,
        top_k: int,
        eps: float = 1e-6,
        loss_coefs: tuple[float, float, float] = (0.01, 0.0, 0.001),
    ) -> None:
        """`loss_coefs`: (load balance, auxiliary, z-loss) weights for routing.router_loss."""
        super().__init__()
        if not 1 <= top_k <= chapters:
            raise ValueError(f"top_k {top_k} must be within 1..chapters ({chapters})")
        MemoryLayer.built += 1
        self.top_k, self.loss_coefs, self.eps = top_k, loss_coefs, eps
        self.norm_weight = nn.Parameter(torch.ones(d))
        self.router = nn.Linear(d, chapters, bias=False)
        self.query = nn.Linear(d, d, bias=False)
        # keys at unit scale against queries of about unit norm: the slots start distinct
        self.keys = nn.Parameter(torch.randn(chapters, slots, d) / math.sqrt(d))
        self.values = nn.Parameter(torch.randn(chapters, slots, d) * 0.02)
        self.gate = nn.Parameter(torch.zeros(d))  # closed: the residual stream as it was
        nn.init.normal_(self.router.weight, std=0.02)
        nn.init.normal_(self.query.weight, std=1.0 / math.sqrt(d))
        self.where: int | None = None  # the block / decoder layer it follows, for the logs

    @property
    def chapters(self) -> int:
        return self.keys.shape[0]

    def read(self, h: Tensor) -> Tensor:
        """The memory's gated contribution for hidden states h (zero while the gate is)."""
        flat = h.reshape(-1, h.shape[-1])
        if flat.shape[0] == 0:  # nothing to read for
            return torch.zeros_like(h)
        w = self.norm_weight  # in its own dtype: a bf16 stream under autocast meets fp32 weights
        x = torch.nn.functional.rms_norm(flat.to(w.dtype), (flat.shape[-1],), w, self.eps)
        logits = self.router(x)
        weights, chosen = route(logits, self.top_k)
        q = self.query(x)
        pairs, valid = grouped(chosen, self.chapters)  # (C, G): each chapter's tokens, padded
        tokens = pairs // self.top_k
        # index_select, whose backward is an index_add (indexing's is a slower index_put)
        queries = q.index_select(0, tokens.flatten()).view(*tokens.shape, -1)
        scores = torch.bmm(queries, self.keys.to(q.dtype).transpose(1, 2))  # (C, G, S)
        mix = (weights.flatten()[pairs] * valid).unsqueeze(-1)  # router weight; padding 0
        # the router weight scales the slot weights and the gate the values: both are small
        # tensors, where scaling the (C, G, d) reads and (N, d) output would cost more; but
        # fp16 would flush a nearly closed gate's products to zero, so there it comes last
        attn = (scores.float().softmax(-1) * mix).to(q.dtype)
        fp16 = q.dtype == torch.float16
        values = self.values if fp16 else self.values * self.gate
        reads = torch.bmm(attn, values.to(q.dtype))  # (C, G, d)
        out = torch.zeros_like(q).index_add(0, tokens.flatten(), reads.flatten(0, 1))
        if fp16:
            out = out.float() * self.gate
        self.record(logits, chosen)
        return out.view(*h.shape[:-1], -1)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.read(h).to(h.dtype)


def memory_layers(model: nn.Module) -> list[MemoryLayer]:
    """The model's memory layers (none, without a walk, while none was built in this process)."""
    if not MemoryLayer.built:
        return []
    return [m for m in model.modules() if isinstance(m, MemoryLayer)]


def memory_metrics(layers: Sequence[MemoryLayer]) -> dict[str, float]:
    """The chapters' routing (memory_router_loss, chapter_load_cv ...) and how far the gates
    opened (mean |gate|: 0 until the memory starts to speak)."""
    out = router_metrics(layers, "chapter", prefix="memory_")
    if out:
        gates = [m.gate.detach().abs().mean() for m in layers]
        out["train/memory_gate"] = float(torch.stack(gates).mean())
    return out


def chosen_indices(layers: Sequence[int], n: int, what: str) -> list[int]:
    """`layers` (negative from the end) as indices into n; out of range is a ValueError."""
    bad = [i for i in layers if not -n <= i < n]
    if bad:
        raise ValueError(
            f"memory.layers names {what} {bad[0]}; there are {n} (0..{n - 1}, or -{n}..-1)"
        )
    if len({i % n for i in layers}) != len(layers):
        raise ValueError(f"memory.layers names one {what} twice (negatives count from the end)")
    return sorted(i % n for i in layers)


def memory_spec(memory: MemorySpec | Any) -> MemorySpec:
    """`memory` itself, or the `memory` section of what holds one (a Plan; until every caller
    passes the spec, a config)."""
    return memory if isinstance(memory, MemorySpec) else getattr(memory, "memory", memory)


def new_memory(d: int, memory: MemorySpec) -> MemoryLayer:
    """A memory layer of width d, shaped by `memory`."""
    m = memory_spec(memory)
    return MemoryLayer(d, m.chapters, m.slots_per_chapter, m.top_k, loss_coefs=m.coefs())


def attach_memory(rack: nn.Module, memory: MemorySpec) -> list[int]:
    """A memory layer (as wide as the rack's embeddings) after each block named by
    memory.layers; returns their indices."""
    m = memory_spec(memory)
    blocks = [b for stack in rack.stacks for b in stack.blocks]  # type: ignore[union-attr]
    where = chosen_indices(m.layers, len(blocks), "block")
    d = rack.embed_tokens.embedding_dim  # type: ignore[union-attr]
    for i in where:
        blocks[i].memory = layer = new_memory(d, m)
        layer.where = i
    return where
