"""Export a causal rack to the Hugging Face Llama format, which `transformers` loads directly.

The rack uses Llama's conventions (RMSNorm, rotate-half RoPE, SwiGLU, q/k/v/o names), so the
export is a renaming of tensors plus a `LlamaConfig`; a rack with attention biases on q, k and
v (model.attention_bias) is a Qwen2 instead (Llama's biases would cover o as well).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stackwise.errors import StackWiseError
from stackwise.model.rack import Rack

BLOCK_NAMES = {  # rack tensor in a block -> Llama's, under model.layers.<i>.
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "ffn.gate_proj.weight": "mlp.gate_proj.weight",
    "ffn.up_proj.weight": "mlp.up_proj.weight",
    "ffn.down_proj.weight": "mlp.down_proj.weight",
}
BIAS_NAMES = {f"attn.{p}_proj.bias": f"self_attn.{p}_proj.bias" for p in "qkv"}


def llama_config(rack: Rack, bidirectional_ok: bool = False) -> Any:
    """`bidirectional_ok`: a masked rack too (its weights then expect full attention)."""
    c = rack.cfg
    if rack.time_embed is not None or not (rack.causal or bidirectional_ok):
        raise ValueError("only causal racks without time conditioning map onto Llama")
    if c.moe.num_experts:
        raise StackWiseError(
            "A rack with model.moe has mixture-of-experts layers, which the Llama format "
            "cannot hold; only dense racks export to Hugging Face."
        )
    if c.attention_bias:
        from transformers import Qwen2Config

        return Qwen2Config(**_shape(rack), use_sliding_window=False)
    from transformers import LlamaConfig

    return LlamaConfig(**_shape(rack), attention_bias=False, mlp_bias=False)


def _shape(rack: Rack) -> dict:
    c = rack.cfg
    return dict(
        vocab_size=rack.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ffn_width,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads or c.n_heads,
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings,
    )


def llama_state_dict(rack: Rack) -> dict[str, torch.Tensor]:
    out = {
        "model.embed_tokens.weight": rack.embed_tokens.weight,
        "model.norm.weight": rack.norm.weight,
    }
    layer = 0
    for stack in rack.stacks:
        for block in stack.blocks:
            if block.memory is not None:
                raise StackWiseError(
                    "This rack has memory layers (train.enabled_extensions: memory), which a "
                    "Llama checkpoint cannot hold; only racks without them export."
                )
            state = block.state_dict()
            if any(name not in names_of(rack) for name in state):
                raise StackWiseError(
                    "This rack has LoRA adapters or quantized stacks, which a Llama checkpoint "
                    "cannot hold. Run `stackwise merge-lora CHECKPOINT OUT` first and export the "
                    "merged rack."
                )
            for name, tensor in state.items():
                out[f"model.layers.{layer}.{names_of(rack)[name]}"] = tensor
            layer += 1
    if rack.lm_head is not None:
        out["lm_head.weight"] = rack.lm_head.weight
    return {k: v.detach().clone() for k, v in out.items()}


def names_of(rack: Rack) -> dict[str, str]:
    """Block tensor names -> the checkpoint's, biases included when the rack has them."""
    return {**BLOCK_NAMES, **BIAS_NAMES} if rack.cfg.attention_bias else BLOCK_NAMES


def rack_parameters(rack: Rack) -> dict[str, torch.Tensor]:
    """The rack's own parameters under Llama's names: where imported weights are copied."""
    out = {"model.embed_tokens.weight": rack.embed_tokens.weight}
    out["model.norm.weight"] = rack.norm.weight
    layer = 0
    for stack in rack.stacks:
        for block in stack.blocks:
            params = dict(block.named_parameters())
            out.update({f"model.layers.{layer}.{h}": params[n] for n, h in names_of(rack).items()})
            layer += 1
    if rack.lm_head is not None:
        out["lm_head.weight"] = rack.lm_head.weight
    return out


def export_llama(rack: Rack, folder: str | Path) -> Path:
    """Write config.json + model.safetensors that LlamaForCausalLM.from_pretrained reads."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    model = AutoModelForCausalLM.from_config(llama_config(rack))
    model.load_state_dict(llama_state_dict(rack), strict=False)
    model.save_pretrained(str(folder))
    return folder
