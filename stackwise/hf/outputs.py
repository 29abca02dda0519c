"""What a fine-tuned run leaves, in the formats the ecosystem reads: the PEFT adapter, the
tokenizer with its chat template, generation_config.json whose EOS list holds the end-of-turn
token, config.yaml, final/ (the model alone, as `PeftModel.from_pretrained` or
`from_pretrained` loads it), and with lora.save_merged the merged model in merged/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.io.files import new_folder

MERGED = "merged"
FINAL = "final"  # the finished model alone: adapter (or whole model), tokenizer, generation
# the weights and their configs as PEFT (adapter) or transformers (whole model) write them
MODEL_FILES = ("adapter_config.json", "adapter_model.safetensors", "config.json")


def generation_config(model: nn.Module, tokenizer: Any) -> Any:
    from transformers import GenerationConfig

    from stackwise.chat.template import end_of_turn_ids

    base = getattr(model, "generation_config", None)
    gen = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
    gen.eos_token_id = end_of_turn_ids(tokenizer)
    gen.pad_token_id = tokenizer.pad_token_id
    gen.bos_token_id = tokenizer.bos_token_id
    return gen


def final_files(folder: Path, model: nn.Module, tokenizer: Any, config: Any) -> None:
    saved = tokenizer.save_pretrained(str(folder))  # beside the adapter, where PEFT users look
    generation_config(model, tokenizer).save_pretrained(str(folder))
    if config.memory_on:
        from stackwise.hf.memory import note_memory

        note_memory(folder)
    else:  # the memory layers have no place in a PEFT or transformers folder
        _final_folder(folder, [Path(f).name for f in saved])
    if config.lora.enabled and config.lora.save_merged:
        merge_run(folder, folder / MERGED, model, tokenizer, config, in_final_save=True)


def _final_folder(folder: Path, tokenizer_files: list[str]) -> None:
    """folder/final: the weights (adapter or whole model), tokenizer and generation config,
    hard links to the run's own files, so nothing large is stored twice (copies where the
    file system has no links)."""
    model = [
        p.name
        for p in folder.iterdir()
        if p.is_file()
        and (p.name in MODEL_FILES or (p.name.startswith("model") and ".safetensors" in p.name))
    ]
    final = folder / FINAL
    final.mkdir(exist_ok=True)
    for name in [*model, "generation_config.json", *tokenizer_files]:
        if (folder / name).is_file() and not (final / name).exists():
            try:
                os.link(folder / name, final / name)
            except OSError:
                shutil.copy2(folder / name, final / name)


def _plain_base(config: Any) -> nn.Module:
    """The base as trained under, on the CPU (the trained model may still fill the GPU): a
    quantized one dequantized, so the merge adds the adapter to the weights it was trained
    against rather than to the original ones; kept in the dtype the base trained in
    (model.dtype, which `auto` takes from the training precision)."""
    from stackwise.hf.load import load_base

    base = load_base(config, torch.device("cpu"))
    if config.model.load_in_4bit or config.model.load_in_8bit:
        base = base.dequantize()
    return base


def _memory_merge(run: Path) -> StackWiseError:
    return StackWiseError(
        f"'{run}' trained memory layers beside its base; a merged Hugging Face model has no "
        "place for them, so it would not be the model you trained. Use the run folder itself: "
        "`stackwise generate --checkpoint RUN --chat ...` loads the base, its memory and any "
        "LoRA adapter."
    )


def merge_run(
    run: Path,
    out: Path,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    config: Any = None,
    probes: int = 4,
    trust_remote_code: bool = False,
    in_final_save: bool = False,
) -> dict[str, float]:
    """Write base + adapter merged into `out` (a plain HF model folder, made whole or not at
    all); returns the largest logit difference between the merged model and base + adapter on
    `probes` inputs. `config` is the run's Plan (the door, stackwise.runs.merge_finetuned,
    reads it from the run's config.yaml); without `model` the run is loaded from `run`."""
    from peft import PeftModel

    if config is None:
        raise TypeError("merge_run needs the run's plan: use stackwise.runs.merge_finetuned")
    if config.memory_on:  # before loading anything
        raise _memory_merge(run)
    if model is None:
        _, model, tokenizer = load_finetuned(run, config, trust_remote_code)
    if not config.lora.enabled:
        raise StackWiseError(
            f"'{run}' fine-tuned the whole model (lora.enabled: false): there is no adapter "
            "to merge, and the run folder already holds the full model."
        )
    device = next(model.parameters()).device
    merged = PeftModel.from_pretrained(_plain_base(config), str(run)).merge_and_unload()
    gen = torch.Generator().manual_seed(0)
    vocab = merged.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (probes, 32), generator=gen)
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids.to(device)).logits.float().cpu()
        got = merged(input_ids=ids).logits.float()
    drift = float((want - got).abs().max())
    if in_final_save:  # the run's final save stages it, and says how to finish on failure
        _write_merged(out, merged, tokenizer)
    else:
        failure = f"Could not write the merged model to '{out}': {{reason}}. Nothing was written."
        with new_folder(out, failure, "merging") as tmp:
            _write_merged(tmp, merged, tokenizer)
    dtype = str(next(merged.parameters()).dtype).replace("torch.", "")
    return {"max_logit_drift": drift, "logit_scale": float(want.abs().max()), "dtype": dtype}


def _write_merged(folder: Path, merged: nn.Module, tokenizer: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    generation_config(merged, tokenizer).save_pretrained(str(folder))


def tokenizer_dir(folder: Path) -> Path:
    """Where the tokenizer of a fine-tune (or of one of its checkpoints) lies."""
    from stackwise.io.checkpoints import STATE

    run = folder.parent if (folder / STATE).is_file() else folder  # a checkpoint's run
    for d in (folder, run, run / "tokenizer"):
        if (d / "tokenizer_config.json").is_file():
            return d
    raise StackWiseError(
        f"'{folder}' has no tokenizer files (nor has its run folder). Pass a run folder "
        "that `stackwise finetune` wrote, or one of its checkpoint-N folders."
    )


def load_finetuned(
    folder: Path, config: Any, trust_remote_code: bool = False
) -> tuple[Any, nn.Module, Any]:
    """(config, base + adapter or the whole fine-tuned model, tokenizer) of a finished run or
    one of its checkpoints, `config` being its Plan (read at the door: stackwise.runs). A run
    whose config trusts remote code is only loaded when the caller says so too
    (--trust-remote-code): a downloaded run folder must not run code."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stackwise.hf.load import ADAPTER_WEIGHTS, device_now, load_base

    if config.model.trust_remote_code and not trust_remote_code:
        raise StackWiseError(
            f"'{folder}' was trained with model.trust_remote_code: true, so loading it runs "
            "Python code from its model folder. Pass --trust-remote-code if you trust it."
        )
    tok_dir = tokenizer_dir(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), trust_remote_code=trust_remote_code)
    if (folder / ADAPTER_WEIGHTS).is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_base(config, device_now()), str(folder))
    elif config.memory_on and not config.lora.enabled:  # the base as it was, and the memory
        model = load_base(config, device_now())
    elif (folder / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), trust_remote_code=trust_remote_code
        )
    else:
        raise StackWiseError(
            f"'{folder}' holds neither a LoRA adapter nor a model. Pass the folder a finished "
            "fine-tuning run wrote, or one of its checkpoint-N folders."
        )
    if config.memory_on:
        from stackwise.hf.memory import attach_memory_hf, load_memory

        attach_memory_hf(model, config)
        load_memory(model, folder)
    model.eval()
    return config, model, tokenizer
