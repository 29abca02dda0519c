"""The Rack: embeddings, optional time conditioning, stacks, final norm and LM head.

The rack you train is the rack you evaluate, save and sample from. Its forward is split into
`embed`, `run_stacks` and `logits` so that progressive training can start or stop at any stack
boundary.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from stackwise.model.chain import DenoisingChain, nested_inputs
from stackwise.model.layers import KVCache, RMSNorm, Stack, TiedHead, init_weights
from stackwise.model.masks import block_mask, block_outputs, sdpa_mask
from stackwise.model.rope import Rotary
from stackwise.model.time import LearnedTime, SinusoidalTime
from stackwise.spec import ModelSpec


class Rack(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        vocab_size: int,
        causal: bool,
        num_time_steps: int | None = None,
        n_stacks: int | None = None,
    ) -> None:
        """`n_stacks` overrides spec.n_stacks; progressive growth starts from 0 stacks."""
        super().__init__()
        self.cfg = spec  # the rack's ModelSpec
        self.vocab_size = vocab_size
        self.causal = causal
        # objective block_diffusion: the input is [noised; clean] (stackwise.model.masks)
        self.block_size = getattr(spec, "diffusion_block", None)  # a Plan sets it; a config not
        self.block_shift = getattr(spec, "diffusion_shift", True)
        self.embed_tokens = nn.Embedding(vocab_size, spec.d_model)
        self.time_embed: nn.Module | None = None
        if spec.time_conditioning == "sinusoidal":
            self.time_embed = SinusoidalTime(spec.d_model, spec.time_embedding_dim)
        elif spec.time_conditioning == "learned":
            if num_time_steps is None:
                raise ValueError("learned time conditioning needs num_time_steps")
            self.time_embed = LearnedTime(spec.d_model, num_time_steps, spec.time_embedding_dim)
        self.rotary = Rotary(spec.d_model // spec.n_heads, spec.max_seq_len, spec.rope_theta)
        n = spec.n_stacks if n_stacks is None else n_stacks
        self.stacks = nn.ModuleList(Stack(spec, causal, index=i) for i in range(n))
        self.norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.depth_ranges: list[tuple[int, float, float]] | None = None
        self.chain: DenoisingChain | None = None
        self.lm_head: nn.Linear | None = None
        self.tied_head: TiedHead | None = None
        if spec.tie_embeddings:
            self.tied_head = TiedHead(self.embed_tokens)
        else:
            self.lm_head = nn.Linear(spec.d_model, vocab_size, bias=False)
        init_weights(self, spec.init_std, spec.n_layers, spec.d_model)

    @property
    def uses_time(self) -> bool:
        """Whether forward needs t: for its time embedding, or to route by depth."""
        return self.time_embed is not None or self.depth_ranges is not None

    def set_depth_routing(
        self,
        ranges: list[tuple[int, float, float]] | None,
        chain: DenoisingChain | None = None,
    ) -> None:
        """Time as depth: per rack position, (growth index, lo, hi) of the noise range its stack
        was trained at. With it set, an input at noise t runs only the stacks grown up to the one
        whose range holds t (in rack order), then the head: exactly the sub-rack that stage
        trained for that noise (with a frozen trunk). None runs every stack for every t.
        With `chain` (stacks grown high-noise-to-low), those stacks run as a denoising chain
        (see stackwise.model.chain)."""
        if ranges is not None and len(ranges) != len(self.stacks):
            raise ValueError(f"{len(ranges)} depth ranges for {len(self.stacks)} stacks")
        if chain is not None:
            if ranges is None or [r[0] for r in ranges] != list(range(len(ranges))):
                raise ValueError("a denoising chain needs stacks in growth order (append mode)")
            tops = [r[2] for r in ranges]
            if any(b >= a for a, b in itertools.pairwise(tops)):
                raise ValueError(f"a denoising chain needs decreasing noise levels, got {tops}")
        self.depth_ranges = ranges
        self.chain = chain

    def depth_of(self, t: torch.Tensor) -> torch.Tensor:
        """(B,) the growth index whose noise range holds each t (the nearest one if none)."""
        assert self.depth_ranges is not None
        by_growth = sorted({(g, lo, hi) for g, lo, hi in self.depth_ranges})
        lo = torch.tensor([r[1] for r in by_growth], device=t.device)
        hi = torch.tensor([r[2] for r in by_growth], device=t.device)
        tt = t.float()[:, None]
        inside = (tt > lo) & (tt <= hi) | ((lo == hi) & (tt == hi))
        distance = torch.where(inside, -1.0, torch.minimum((tt - lo).abs(), (tt - hi).abs()))
        order = torch.tensor([r[0] for r in by_growth], device=t.device)
        return order[distance.argmin(dim=1)]

    def _routed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, t: torch.Tensor
    ) -> torch.Tensor:
        assert self.depth_ranges is not None
        h = self.embed(input_ids, t if self.time_embed is not None else None)
        depth = self.depth_of(t)
        out: torch.Tensor | None = None
        for g in depth.unique().tolist():
            rows = depth == g
            stacks = [s for s, r in zip(self.stacks, self.depth_ranges, strict=True) if r[0] <= g]
            mask = attention_mask[rows] if attention_mask is not None else None
            part = self.logits(self.run_stacks(h[rows], mask, stacks))
            if out is None:
                out = part.new_empty((input_ids.shape[0], *part.shape[1:]))
            out[rows] = part
        assert out is not None
        return out

    def _chained(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, t: torch.Tensor
    ) -> torch.Tensor:
        """Stacks 0..g as one denoising chain for an input at noise t in stack g's range."""
        assert self.depth_ranges is not None and self.chain is not None
        tops = [r[2] for r in self.depth_ranges]
        depth = self.depth_of(t)
        out: torch.Tensor | None = None
        for g in depth.unique().tolist():
            rows = depth == g
            mask = attention_mask[rows] if attention_mask is not None else None
            inputs = nested_inputs(self.chain, input_ids[rows], t[rows], tops[:g], mask)
            h = self.embed(inputs[0])
            for i in range(g + 1):
                if i:
                    h = self.chain_input(h, inputs[i])
                h = self.run_stacks(h, mask, [self.stacks[i]])
            part = self.logits(h)
            if out is None:
                out = part.new_empty((input_ids.shape[0], *part.shape[1:]))
            out[rows] = part
        assert out is not None
        return out

    def chain_input(self, h: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """The next chain stack's input: the previous stack's output, rescaled to the
        embeddings' size, plus the embeddings of the sequence as it now stands. Without the
        rescaling a stack's output (hundreds of times the embeddings' norm) drowned the revealed
        tokens, and every later stack predicted the same thing whatever the context."""
        table = self.embed_tokens.weight
        scale = table.float().pow(2).mean().sqrt()
        rms = h.float().pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        return (h.float() * (scale / rms)).to(h.dtype) + self.embed_tokens(input_ids)

    def embed(self, input_ids: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.time_embed is not None:
            if t is None:
                raise ValueError("this rack is time-conditioned: pass t (one value per example)")
            noise = self.time_embed(t).to(h.dtype)[:, None, :]
            if self.block_size is None:
                return h + noise
            half = h.shape[1] // 2  # the clean copy is at noise 0: no time input
            return torch.cat([h[:, :half] + noise, h[:, half:]], dim=1)
        return h

    def run_stacks(
        self,
        h: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        stacks: Sequence[nn.Module] | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        rope, mask = self.positions(h, attention_mask, cache)
        for stack in self.stacks if stacks is None else stacks:
            h = stack(h, rope, mask, cache) if cache is not None else stack(h, rope, mask)
        if cache is not None and cache.writing:
            cache.length += h.shape[1]
        return h

    def positions(
        self, h: torch.Tensor, attention_mask: torch.Tensor | None, cache: KVCache | None
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """The RoPE tables and attention mask for running `h` (after the cache's positions)."""
        start = cache.length if cache is not None else 0
        length = h.shape[1]
        doubled = self.block_size is not None and cache is None  # [noised; clean]
        if doubled and length % 2:
            raise ValueError(
                f"a block-diffusion rack reads [noised; clean], two copies of one sequence; "
                f"got an odd length {length}. Pass torch.cat([noised_ids, clean_ids], dim=1)"
            )
        real = start + (length // 2 if doubled else length)
        if real > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {real} exceeds max_seq_len {self.cfg.max_seq_len}")
        if doubled:
            cos, sin = self.rotary(length // 2)  # both copies sit at positions 0..L-1
            cos, sin = torch.cat([cos, cos]), torch.cat([sin, sin])
            mask = block_mask(attention_mask, length // 2, self.block_size, h.device)
        else:
            cos, sin = self.rotary(start + length)
            cos, sin = cos[start:], sin[start:]
            if cache is not None and attention_mask is not None:
                raise ValueError("the KV cache decodes unpadded causal sequences only")
            if cache is not None and start > 0 and length > 1 and self.causal:
                raise ValueError("with a filled KV cache, feed one new token at a time")
            mask = sdpa_mask(attention_mask, self.causal, length)
        return (cos, sin), mask

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The head over the stacks' output; a block-diffusion rack's doubled output gives
        one prediction per position (stackwise.model.masks.block_outputs)."""
        if self.block_size is not None:
            h = block_outputs(h, self.block_size, self.block_shift)
        return self.head(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and output projection of hidden states, position by position."""
        h = self.norm(h)
        if self.lm_head is None:
            assert self.tied_head is not None
            return self.tied_head(h)
        return self.lm_head(h)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits; with `cache` (causal racks), only the new tokens are computed and cached."""
        if cache is not None and not self.causal:
            raise ValueError("a KV cache only serves causal racks")
        if self.depth_ranges is not None:
            if t is None:
                raise ValueError("this rack routes by noise level (time as depth): pass t")
            if self.chain is not None:
                return self._chained(input_ids, attention_mask, t)
            return self._routed(input_ids, attention_mask, t)
        h = self.run_stacks(self.embed(input_ids, t), attention_mask, cache=cache)
        return self.logits(h)

    def param_groups(self) -> dict[str, list[tuple[str, nn.Parameter]]]:
        """Named groups for per-group learning rates: embeddings, time, blocks, head, lora and
        memory (every memory layer, its router included)."""
        groups: dict[str, list[tuple[str, nn.Parameter]]] = {
            "embeddings": [],
            "time": [],
            "blocks": [],
            "head": [],
            "lora": [],
            "memory": [],
        }
        for name, p in self.named_parameters():
            if "lora_" in name:
                groups["lora"].append((name, p))
            elif ".memory." in name:
                groups["memory"].append((name, p))
            elif name.startswith("embed_tokens"):
                groups["embeddings"].append((name, p))
            elif name.startswith("time_embed"):
                groups["time"].append((name, p))
            elif name.startswith("stacks"):
                groups["blocks"].append((name, p))
            else:
                groups["head"].append((name, p))
        return groups


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Weights, not storage elements: a packed 4-bit tensor of n bytes holds 2n weights, and
    a ZeRO-3 partitioned one its whole size (`ds_numel`), not this process's part."""
    total = 0
    for m in module.modules():
        for name, p in m.named_parameters(recurse=False):
            if trainable_only and not p.requires_grad:
                continue
            packed = not p.is_floating_point() and name == "weight" and hasattr(m, "in_features")
            whole = getattr(p, "ds_numel", None) or p.numel()
            total += m.in_features * m.out_features if packed else whole
    return total
