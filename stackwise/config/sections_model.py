"""The model section: the rack's shape, or the Hugging Face model to load instead. Which
shape fields make weights a different function is spec.model.RACK_SHAPE_FIELDS."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from stackwise.config.base import Section
from stackwise.config.moe import MoEConfig
from stackwise.precision import ModelDtype, Storage4bit
from stackwise.spec.model import RACK_SHAPE_FIELDS  # noqa: F401  (kept importable here)


class ModelConfig(Section):
    vocab_size: PositiveInt | None = Field(
        None, description="Vocabulary size; None takes it from the tokenizer."
    )
    d_model: PositiveInt = Field(
        128,
        description="Hidden size: the width of every block's input and output; n_heads must "
        "divide it.",
    )
    n_heads: PositiveInt = Field(
        4,
        description="Attention heads per block; each gets d_model / n_heads dimensions, which "
        "must be even (RoPE).",
    )
    n_kv_heads: PositiveInt | None = Field(None, description="Key/value heads (GQA); None = MHA.")
    n_stacks: PositiveInt = Field(
        2, description="Stacks in the finished rack; progressive growth adds one per stage."
    )
    blocks_per_stack: PositiveInt = Field(
        2,
        description="Transformer blocks in each stack: the rack has n_stacks x blocks_per_stack "
        "blocks.",
    )
    ffn_hidden: PositiveInt | None = Field(None, description="SwiGLU width; None = ~8/3 d_model.")
    max_seq_len: PositiveInt = Field(
        256,
        description="The rack's context in tokens (its RoPE table): data.seq_len must fit in it, "
        "and so must a masked rack's prompt plus generation.",
    )
    rope_theta: PositiveFloat = Field(
        10000.0,
        description="Base of the rotary position embedding's frequencies; larger bases suit "
        "longer contexts.",
    )
    norm_eps: PositiveFloat = Field(
        1e-5, description="Epsilon added inside every RMSNorm for numerical stability."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout rate on the attention weights and on each sublayer's output, in "
        "training only; 0 disables it.",
    )
    tie_embeddings: bool = Field(
        True,
        description="The output head reuses the token embedding matrix; false gives the head "
        "weights of its own.",
    )
    frozen_up_proj: bool = Field(False, description="Freeze a random SwiGLU up-projection.")
    moe: MoEConfig = Field(default_factory=MoEConfig)
    time_conditioning: Literal["none", "sinusoidal", "learned"] = Field(
        "none",
        description="diffusion: how the rack is told the noise level t, added to the token "
        "embeddings: none, sinusoidal features, or a learned vector per grid step (needs "
        "masking.num_time_steps).",
    )
    time_embedding_dim: PositiveInt | None = Field(
        None,
        description="Width of the time embedding (sinusoidal features, or a learned row, "
        "projected to d_model); None = d_model.",
    )
    init_std: PositiveFloat = Field(
        0.02,
        description="Std of the normal initialisation of weight matrices; attention and MLP "
        "output projections get init_std / sqrt(2 x blocks).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each block's activations in the backward pass instead of keeping "
        "them: less memory for more compute.",
    )
    attention_bias: bool = Field(
        False, description="Biases on q, k and v (Qwen2's attention); exported as Qwen2."
    )
    init_from_hf: str | None = Field(
        None,
        description="A local Llama checkpoint dir to start from: its shape, weights and "
        "tokenizer (layers grouped into stacks of blocks_per_stack).",
    )
    source: Literal["rack", "hf"] = Field(
        "rack", description="rack: StackWise's own model; hf: a Hugging Face causal LM."
    )
    model_name_or_path: str | None = Field(
        None, description="hf: a local model dir (or a hub name where a hub is reachable)."
    )
    dtype: ModelDtype = Field(
        "auto", description="hf: the base weights' dtype; auto: bf16 when training in bf16."
    )
    load_in_4bit: bool = Field(False, description="hf: NF4/FP4 base through bitsandbytes.")
    load_in_8bit: bool = Field(False, description="hf: int8 base through bitsandbytes.")
    quant_type_4bit: Literal["nf4", "fp4"] = Field(
        "nf4", description="hf, load_in_4bit: the 4-bit data type, nf4 (NormalFloat) or fp4."
    )
    double_quant: bool = Field(True, description="4-bit: quantize the block scales too.")
    compute_dtype: ModelDtype = Field(
        "auto", description="4-bit: the matmul dtype; auto follows model.dtype."
    )
    quant_storage: Storage4bit = Field(
        "uint8", description="4-bit: the packed weights' storage dtype (FSDP2 shards uint8)."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa",
        description="hf: the attention kernel transformers runs; flash_attention_2 needs the "
        "flash-attn package.",
    )
    trust_remote_code: bool = Field(
        False, description="hf: run the model repo's own Python code; only for repos you trust."
    )

    @property
    def n_layers(self) -> int:
        return self.n_stacks * self.blocks_per_stack

    @property
    def d_ff(self) -> int:
        """The SwiGLU width as the seeds name it (model.ffn_hidden, resolved)."""
        return self.ffn_width

    @property
    def ffn_width(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return ((8 * self.d_model // 3) + 7) // 8 * 8
