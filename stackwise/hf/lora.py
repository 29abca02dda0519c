"""LoRA on a Hugging Face model through PEFT, and the optimizer groups it trains in."""

from __future__ import annotations

from typing import Any

from torch import nn

from stackwise.errors import StackWiseError

INIT = {"default": True, "gaussian": "gaussian", "pissa": "pissa", "olora": "olora"}


def tied(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    return bool(getattr(text, "tie_word_embeddings", False))


def _targets(value: str | list[str] | tuple[str, ...]) -> str | list[str]:
    """all-linear stays PEFT's keyword; any other single name is a list of one (PEFT would
    read a bare string as a regular expression over full module paths)."""
    if isinstance(value, list | tuple):
        return list(value)
    return value if value == "all-linear" else [value]


def attach_lora(model: nn.Module, config: Any) -> nn.Module:
    """The PeftModel of `model` under config.lora; the base is frozen by PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model

    lo = config.lora
    init = "loftq" if lo.init_lora_weights == "loftq" else INIT[lo.init_lora_weights]
    if init == "loftq" and not torch.cuda.is_available():
        raise StackWiseError(
            "lora.init_lora_weights: loftq needs a CUDA GPU (PEFT computes LoftQ there); on "
            "this machine use default, gaussian, pissa or olora."
        )
    embeds_trained = any(
        name in ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out")
        for name in lo.modules_to_save
    )
    peft_config = LoraConfig(
        task_type="CAUSAL_LM",
        r=lo.rank,
        lora_alpha=lo.alpha,
        lora_dropout=lo.dropout,
        target_modules=_targets(lo.target_modules),
        use_dora=lo.use_dora,
        use_rslora=lo.use_rslora,
        init_lora_weights=True if init == "loftq" else init,
        modules_to_save=list(lo.modules_to_save) or None,
        ensure_weight_tying=embeds_trained and tied(model),
    )
    try:
        peft_model = get_peft_model(model, peft_config)
    except ValueError as err:
        raise StackWiseError(
            f"PEFT refused the LoRA settings: {str(err)[:300].rstrip('.')}. Check "
            "lora.target_modules (module names of this model) and lora.modules_to_save."
        ) from None
    if init == "loftq":
        from peft import replace_lora_weights_loftq

        replace_lora_weights_loftq(peft_model, model_path=config.model.model_name_or_path)
    return peft_model


def named_groups(model: nn.Module, config: Any) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """lora (A and DoRA magnitudes), lora_B (its own group for LoRA+), memory (the memory
    layers, routers included), base (the rest that trains: modules_to_save, or everything in
    full fine-tuning)."""
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {
        "lora": [],
        "lora_B": [],
        "memory": [],
        "base": [],
    }
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if "stackwise_memory." in name:
            groups["memory"].append((name, p))
        elif ".lora_B." in name and config.lora.loraplus_lr_ratio:
            groups["lora_B"].append((name, p))
        elif ".lora_" in name:
            groups["lora"].append((name, p))
        else:
            groups["base"].append((name, p))
    return groups


def group_lr(name: str, tc: Any, config: Any) -> float:
    """The LR of a group: train.group_lr.lora / memory / base over train.lr; LoRA+ multiplies
    B's."""
    if name == "lora_B":
        return (tc.group_lr.lora or tc.lr) * config.lora.loraplus_lr_ratio
    return getattr(tc.group_lr, name, None) or tc.lr
