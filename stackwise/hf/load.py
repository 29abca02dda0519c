"""Loading a Hugging Face base and its tokenizer, with the quantization and attention asked for.

A quantized base is frozen and kept in its own dtypes: we do not call PEFT's
`prepare_model_for_kbit_training`, which casts every non-quantized weight to fp32 (the
bitsandbytes#1569 / peft#1149 memory trap). LoRA weights are fp32; autocast does the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.precision import HALF_FLOATS, torch_dtype

ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"


def device_now() -> torch.device:
    """The device Accelerate gives this process (the Trainer's)."""
    from stackwise.train.hardware import process_state

    return process_state().device


def source_path(name: str) -> str:
    """A local dir as an absolute path (the saved config then works from anywhere); anything
    else is a hub name, which loads only where a hub (or its cache) is reachable. A path that
    is not there (or not a model folder) is refused before any data is read."""
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or path.exists()
    if path.is_file():
        raise StackWiseError(
            f"model.model_name_or_path '{name}' is a file, but a model is a folder written by "
            "save_pretrained (config.json, weights, tokenizer files). Give that folder."
        )
    if looks_local and not (path / "config.json").is_file():
        raise _missing(name)
    if looks_local:
        _check_config_json(path / "config.json")
    return str(path.resolve()) if path.exists() else name


def _check_config_json(file: Path) -> None:
    """A damaged config.json fails inside the tokenizer's loader first, whose error would blame
    the tokenizer: named here instead."""
    import json

    try:
        json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StackWiseError(
            f"The base model's '{file}' is not valid JSON ({err}). The model folder is damaged: "
            "restore config.json (save the model again with save_pretrained, or download it "
            "again)."
        ) from None


def base_dtype(config: Any, device: torch.device) -> torch.dtype:
    """model.dtype; auto: the training precision for a frozen (LoRA) base, fp32 when the base
    itself trains (AdamW on bf16 weights loses small updates)."""
    from stackwise.train.hardware import resolve_precision

    name = config.model.dtype
    if name == "auto":
        half = resolve_precision(config.train.mixed_precision, device)
        name = half if config.lora.enabled and half in HALF_FLOATS else "fp32"
    return torch_dtype(name)


def quantization(config: Any, dtype: torch.dtype) -> Any:
    m = config.model
    if not (m.load_in_4bit or m.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if m.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = dtype if m.compute_dtype == "auto" else torch_dtype(m.compute_dtype)
    storage = torch.uint8 if m.quant_storage == "uint8" else torch_dtype(m.quant_storage)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=m.quant_type_4bit,
        bnb_4bit_use_double_quant=m.double_quant,
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_quant_storage=storage,
    )


def _missing(path: str) -> StackWiseError:
    return StackWiseError(
        f"model.model_name_or_path '{path}' is not a local model folder, and no hub is "
        "reachable to fetch it by name. Give a folder written by save_pretrained (it holds "
        "config.json), or run where the hub (or its cache) is reachable."
    )


def _damaged(path: str, err: Exception) -> StackWiseError:
    return StackWiseError(
        f"The weights in model folder '{path}' cannot be read ({str(err)[:200]}): a file there "
        "is missing, truncated or damaged, as an interrupted download or copy leaves it. "
        "Download or copy the model again, then rerun."
    )


def load_base(config: Any, device: torch.device) -> nn.Module:
    """model.model_name_or_path's causal LM in the run's dtype (quantized where the config
    asks), ready to train."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-load "Loading weights" bar: noise in our logs

    m = config.model
    dtype = base_dtype(config, device)
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": m.attn_implementation,
        "trust_remote_code": m.trust_remote_code,
    }
    quant = quantization(config, dtype)
    if quant is not None:
        kwargs["quantization_config"] = quant
        kwargs["device_map"] = {"": device}  # bitsandbytes packs the weights where they run
    model = _from_pretrained(m.model_name_or_path, kwargs)
    _ready_to_train(model, m)
    return model


def _from_pretrained(path: str, kwargs: dict[str, Any]) -> nn.Module:
    """AutoModelForCausalLM.from_pretrained, each failure an error that says what to fix."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ImportError as err:
        raise StackWiseError(
            f"Loading '{path}' needs a package that is not installed ({str(err)[:200]}). "
            "Install it, or pick model.attn_implementation: sdpa."
        ) from None
    except OSError as err:
        if (Path(path) / "config.json").is_file():  # the folder is there: its weights are not
            raise _damaged(path, err) from None
        raise _missing(path) from None
    except SafetensorError as err:
        raise _damaged(path, err) from None
    except ValueError as err:
        raise StackWiseError(
            f"Cannot load '{path}' as a causal LM: {str(err)[:240]}. Check "
            "model.model_name_or_path (and model.trust_remote_code for custom model code)."
        ) from None


def _ready_to_train(model: nn.Module, m: Any) -> None:
    """NF4 layout pinned, no KV cache, and gradient checkpointing where model.* asks for it."""
    if m.load_in_4bit:
        from stackwise.quant.layers import pin_nf4_layout

        pin_nf4_layout(model)  # bitsandbytes' AVX512-BF16 eval repacking drifts the weights
    model.config.use_cache = False  # the KV cache only serves generation
    if m.gradient_checkpointing:
        recompute = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=recompute)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=recompute)
        model.enable_input_require_grads()  # so LoRA under checkpointing still gets gradients


def load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer; without a pad token, EOS pads (safe: padding is masked by
    position, never by id)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise StackWiseError(
            f"Cannot load a tokenizer from '{path}' ({str(err)[:200]}). The model folder needs "
            "its tokenizer files (tokenizer.json or tokenizer.model with tokenizer_config.json)."
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
