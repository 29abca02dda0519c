"""The model's specs: a rack's shape and initialisation, its routed layers, an HF source."""

from __future__ import annotations

from dataclasses import dataclass

# the model fields that make a rack's weights a different function (a resume that changes one
# is refused)
RACK_SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "n_stacks",
    "blocks_per_stack",
    "ffn_hidden",
    "max_seq_len",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
    "frozen_up_proj",
    "time_conditioning",
    "time_embedding_dim",
    "attention_bias",
)


@dataclass(frozen=True)
class RouterLossSpec:
    """The weights of the router losses of one routed family (MoE experts, memory chapters)."""

    load_balance_coef: float = 0.01
    auxiliary_coef: float = 0.0
    z_loss_coef: float = 0.001

    def coefs(self) -> tuple[float, float, float]:
        return self.load_balance_coef, self.auxiliary_coef, self.z_loss_coef


@dataclass(frozen=True)
class MoESpec(RouterLossSpec):
    num_experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None
    shared_expert: bool = False
    router_jitter: float = 0.0
    expert_hidden: int | None = None
    stacks: tuple[int, ...] | None = None

    def at(self, index: int) -> bool:
        """Whether the stack grown `index`-th has MoE feed-forward layers."""
        return self.num_experts > 0 and (self.stacks is None or index in self.stacks)


@dataclass(frozen=True)
class MemorySpec(RouterLossSpec):
    chapters: int = 8
    slots_per_chapter: int = 16
    top_k: int = 2
    layers: tuple[int, ...] = (-1,)


@dataclass(frozen=True)
class ModelSpec:
    """A rack's shape (rack) or the HF model to load (hf); `vocab_size` is resolved."""

    vocab_size: int | None = None
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None
    n_stacks: int = 2
    blocks_per_stack: int = 2
    ffn_hidden: int | None = None
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    tie_embeddings: bool = True
    frozen_up_proj: bool = False
    moe: MoESpec = MoESpec()
    time_conditioning: str = "none"
    time_embedding_dim: int | None = None
    init_std: float = 0.02
    gradient_checkpointing: bool = False
    attention_bias: bool = False
    init_from_hf: str | None = None
    source: str = "rack"
    model_name_or_path: str | None = None
    dtype: str = "auto"
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    quant_type_4bit: str = "nf4"
    double_quant: bool = True
    compute_dtype: str = "auto"
    quant_storage: str = "uint8"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    # objective block_diffusion's block size (from objective.block_size): the rack reads its
    # input as [noised; clean] with block-causal attention (stackwise.model.masks)
    diffusion_block: int | None = None
    diffusion_shift: bool = True  # objective.block_shift: token j predicted at position j - 1

    @property
    def n_layers(self) -> int:
        return self.n_stacks * self.blocks_per_stack

    @property
    def ffn_width(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return ((8 * self.d_model // 3) + 7) // 8 * 8
