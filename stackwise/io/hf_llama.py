"""Racks to and from Hugging Face Llama (and Qwen2) checkpoints: `stackwise export-hf RUN OUT`,
and `model.init_from_hf: DIR` to start a run from a checkpoint's shape, weights and tokenizer.

A rack is a Llama in all but name: pre-norm blocks of RMSNorm, rotate-half RoPE attention (with
grouped KV heads) and a SwiGLU MLP, a final RMSNorm and a head tied or not to the embeddings.
So export is a renaming of tensors plus a LlamaConfig; nothing is approximated. What a Llama
cannot hold is refused with the reason: a time-conditioned rack (the time embedding), a rack
routed by noise level (its stacks answer different inputs), and quantized or LoRA stacks (run
`stackwise merge-lora` first). A masked (mlm/diffusion) rack is exported with a note in its
config: its weights were trained bidirectionally, while LlamaForCausalLM attends causally.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stackwise.errors import StackWiseError
from stackwise.io.files import new_folder, save_tensors
from stackwise.model.hf import llama_config, llama_state_dict, rack_parameters

if TYPE_CHECKING:
    from stackwise.io.trained import PlanReader


def export_config(config: Any, rack: Any, tokenizer: Any) -> Any:
    """The Llama config of a rack, with its tokenizer's special ids, and for a masked rack a
    note that it was trained bidirectionally."""
    hf = llama_config(rack, bidirectional_ok=True)
    hf.bos_token_id, hf.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    hf.pad_token_id = tokenizer.pad_token_id
    if rack.block_size is not None:
        hf.stackwise_note = (
            f"trained as a block-diffusion model (blocks of {rack.block_size}, a noised and a "
            f"clean copy of the text, mask token id {tokenizer.mask_token_id}); "
            "LlamaForCausalLM attends causally over one copy, so its logits differ from the "
            "rack's. Sample it with `stackwise generate` from the run folder."
        )
    elif not config.objective.causal:
        hf.stackwise_note = (
            f"trained as a bidirectional {config.objective.name} model (mask token id "
            f"{tokenizer.mask_token_id}); LlamaForCausalLM attends causally, so its logits "
            "differ from the rack's. Sample it with `stackwise generate` from the run folder."
        )
    return hf


def check_exportable(config: Any, rack: Any) -> None:
    if config.model.moe.num_experts:
        raise StackWiseError(
            "This rack has mixture-of-experts layers (model.moe), which the Llama format "
            "cannot hold; only dense racks export to Hugging Face."
        )
    if config.memory_on:
        raise StackWiseError(
            "This rack has memory layers (train.enabled_extensions: memory), which the Llama "
            "format cannot hold; only racks without them export to Hugging Face."
        )
    if rack.time_embed is not None:
        raise StackWiseError(
            f"This rack is time-conditioned (model.time_conditioning: "
            f"{config.model.time_conditioning}); a Llama has no input for the noise level, so it "
            "cannot be exported. Train with time_conditioning: none to export."
        )
    if rack.depth_ranges is not None:
        raise StackWiseError(
            "This rack was grown with time as depth: each noise level runs its own stacks, "
            "which a Llama (every layer on every input) cannot express. It cannot be exported."
        )
    if len(rack.stacks) == 0:
        raise StackWiseError("This rack has no stacks yet: there is nothing to export.")


def export_hf(run: str | Path, out: str | Path, *, read_plan: PlanReader) -> Path:
    """Write OUT/config.json, OUT/model.safetensors and OUT/tokenizer files for RUN's rack,
    its Plan from `read_plan` (the door, stackwise.runs.export_hf, passes
    stackwise.runs.read_plan)."""
    from stackwise.io.trained import load_trained

    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise StackWiseError(f"'{out}' is a file; OUT must be a new folder. Nothing was written.")
    if out.exists() and any(out.iterdir()):
        raise StackWiseError(
            f"'{out}' exists and is not empty; nothing was written. Pick a new folder."
        )
    config, rack, tokenizer = load_trained(run, read_plan)
    check_exportable(config, rack)
    state = {k: v.float() for k, v in llama_state_dict(rack).items()}
    failure = f"Could not write the export to '{out}': {{reason}}. Nothing was written."
    with new_folder(out, failure, "exporting") as tmp:
        save_tensors(state, tmp / "model.safetensors")
        export_config(config, rack, tokenizer).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    return out


# -- import: model.init_from_hf ---------------------------------------------------------------

# Llama config key -> ModelConfig field
SHAPE_KEYS = {
    "hidden_size": "d_model",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "intermediate_size": "ffn_hidden",
    "max_position_embeddings": "max_seq_len",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_embeddings",
    "vocab_size": "vocab_size",
}


def read_llama_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise StackWiseError(
            f"model.init_from_hf: '{folder}' holds no config.json. Point it at a local folder "
            "saved with save_pretrained (a Llama checkpoint)."
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    kind = data.get("model_type", "unknown")
    llama = kind == "llama" and not data.get("attention_bias") and not data.get("mlp_bias")
    if not (llama or kind == "qwen2"):
        raise StackWiseError(
            f"model.init_from_hf: '{folder}' is a '{kind}' model; racks import Llama "
            "checkpoints without biases (model_type llama) and Qwen2 ones (biases on q, k "
            "and v). Other architectures are not supported yet."
        )
    if kind == "qwen2" and data.get("use_sliding_window"):
        raise StackWiseError(
            f"model.init_from_hf: '{folder}' uses sliding-window attention, which racks do not "
            "implement; its logits would differ."
        )
    rope = data.get("rope_parameters") or {}
    data.setdefault("rope_theta", rope.get("rope_theta", 10000.0))  # transformers 5 nests it
    scaling = data.get("rope_scaling") or rope
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise StackWiseError(
            f"model.init_from_hf: '{folder}' uses RoPE scaling {scaling}, which racks do not "
            "implement; its logits would differ. Use a checkpoint with default RoPE."
        )
    return data


def init_changes(config: Any) -> dict[str, Any]:
    """The config changes that make the rack the imported Llama's shape: `model.*` from its
    config.json (the layers grouped into stacks of model.blocks_per_stack) and its tokenizer.
    A field the user set to another value is an error naming both."""
    folder = Path(config.model.init_from_hf).expanduser()
    hf = read_llama_config(folder)
    m = config.model
    wanted = {field: hf[key] for key, field in SHAPE_KEYS.items() if key in hf}
    wanted["attention_bias"] = hf.get("model_type") == "qwen2"
    if wanted.get("n_kv_heads") == wanted.get("n_heads"):
        wanted["n_kv_heads"] = None
    layers = int(hf["num_hidden_layers"])
    if layers % m.blocks_per_stack:
        raise StackWiseError(
            f"model.init_from_hf: the checkpoint has {layers} layers, which model."
            f"blocks_per_stack={m.blocks_per_stack} does not divide. Pick a divisor of {layers}."
        )
    wanted["n_stacks"] = layers // m.blocks_per_stack
    if config.progressive.strategy == "progressive":  # growth adds stacks after the import
        if not m.changed("n_stacks") or m.n_stacks <= wanted["n_stacks"]:
            raise StackWiseError(
                f"model.init_from_hf with progressive growth grows stacks on the imported "
                f"{wanted['n_stacks']} (frozen) stacks: set model.n_stacks above "
                f"{wanted['n_stacks']} (got {m.n_stacks})."
            )
        wanted["n_stacks"] = m.n_stacks
    clashes = [
        f"model.{name}={getattr(m, name)} (the checkpoint has {value})"
        for name, value in wanted.items()
        if m.changed(name) and getattr(m, name) != value
    ]
    tok = config.data.tokenizer
    if tok is not None and Path(tok).expanduser() != folder:
        clashes.append(f"data.tokenizer={tok} (the checkpoint's own is in {folder})")
    for name in ("bpe_vocab_size", "bpe_sample_mb"):
        if config.data.changed(name):
            clashes.append(f"data.{name} (the checkpoint brings its tokenizer)")
    if clashes:
        raise StackWiseError(
            "model.init_from_hf takes the model's shape and tokenizer from the checkpoint, but "
            f"the config sets {'; '.join(clashes)}. Remove those settings."
        )
    return {**{f"model.{k}": v for k, v in wanted.items()}, "data.tokenizer": str(folder)}


def load_llama_weights(rack: Any, folder: str | Path) -> None:
    """Copy a Llama checkpoint's weights into a rack of its shape (time embeddings, which a
    Llama has not, keep their fresh initialisation)."""
    from stackwise.io.files import read_tensors

    folder = Path(folder).expanduser()
    fix = "Point model.init_from_hf at a complete Llama checkpoint."
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise StackWiseError(f"'{folder}' holds no model*.safetensors weights. {fix}")
    theirs: dict[str, torch.Tensor] = {}
    for path in files:
        theirs.update(read_tensors(path, fix))
    if rack.cfg.tie_embeddings:
        theirs.pop("lm_head.weight", None)  # saved tied copies are the embeddings themselves
    ours = llama_state_dict(rack)
    missing = sorted(set(ours) - set(theirs))
    extra = sorted(set(theirs) - set(ours))
    bad = [k for k in ours if k in theirs and theirs[k].shape != ours[k].shape]
    if missing or extra or bad:
        detail = missing[:1] or extra[:1] or bad[:1]
        raise StackWiseError(
            f"The weights in '{folder}' do not fit the rack built from its config.json "
            f"(first problem: {detail[0]}). {fix}"
        )
    targets = rack_parameters(rack)
    with torch.no_grad():
        for name, tensor in theirs.items():
            targets[name].copy_(tensor)
