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
    d_model: PositiveInt = 128
    n_heads: PositiveInt = 4
    n_kv_heads: PositiveInt | None = Field(None, description="Key/value heads (GQA); None = MHA.")
    n_stacks: PositiveInt = 2
    blocks_per_stack: PositiveInt = 2
    ffn_hidden: PositiveInt | None = Field(None, description="SwiGLU width; None = ~8/3 d_model.")
    max_seq_len: PositiveInt = 256
    rope_theta: PositiveFloat = 10000.0
    norm_eps: PositiveFloat = 1e-5
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    tie_embeddings: bool = True
    frozen_up_proj: bool = Field(False, description="Freeze a random SwiGLU up-projection.")
    moe: MoEConfig = Field(default_factory=MoEConfig)
    time_conditioning: Literal["none", "sinusoidal", "learned"] = "none"
    time_embedding_dim: PositiveInt | None = Field(
        None,
        description="Width of the time embedding (sinusoidal features, or a learned row, "
        "projected to d_model); None = d_model.",
    )
    init_std: PositiveFloat = 0.02
    gradient_checkpointing: bool = False
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
    quant_type_4bit: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = Field(True, description="4-bit: quantize the block scales too.")
    compute_dtype: ModelDtype = Field(
        "auto", description="4-bit: the matmul dtype; auto follows model.dtype."
    )
    quant_storage: Storage4bit = Field(
        "uint8", description="4-bit: the packed weights' storage dtype (FSDP2 shards uint8)."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
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
