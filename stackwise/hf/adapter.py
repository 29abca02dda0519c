"""The model adapter of Hugging Face causal LMs (model.source: hf): a PEFT LoRA (or QLoRA) model,
or the whole model, trained on instruction targets by the same Trainer as racks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Generator, nn

from stackwise.errors import StackWiseError
from stackwise.hf import loss as hf_loss
from stackwise.hf.load import ADAPTER_WEIGHTS, FULL_WEIGHTS, device_now
from stackwise.hf.memory import describe_memory, load_memory, save_memory
from stackwise.io.files import read_json, read_tensors, write_json
from stackwise.io.sharded import is_sharded_model
from stackwise.model.memory import memory_layers, memory_metrics
from stackwise.model.routing import router_loss, routing_scope
from stackwise.objectives.base import Batch, Objective
from stackwise.spec import Plan
from stackwise.train.adapters import ModelAdapter, register_model_adapter

SHARD_INDEX = "model.safetensors.index.json"
BASE_IDENTITY = "base_model.json"  # which base an adapter checkpoint was trained on


def _tied_keys(model: nn.Module) -> set[str]:
    """State-dict entries that share storage with another (tied copies, which save_pretrained
    leaves out of the file)."""
    first: dict[int, str] = {}
    tied = set()
    for key, value in model.state_dict(keep_vars=True).items():
        ptr = value.data_ptr()
        if ptr in first:
            tied |= {key, first[ptr]}
        else:
            first[ptr] = key
    return tied


def base_identity(model: nn.Module, name: str) -> dict[str, Any]:
    """What tells one base from another: its type and a few of its embedding weights (read
    before LoRA attaches; the same base loaded in another dtype gives them within rounding)."""
    weight = model.get_input_embeddings().weight.detach()
    rows = torch.linspace(0, weight.shape[0] - 1, 8).long()
    probe = weight[rows.to(weight.device), :8].float().cpu().flatten().tolist()
    return {"model_name_or_path": name, "model_type": model.config.model_type, "probe": probe}


def check_base(folder: Path, base: dict[str, Any]) -> None:
    """Refuse to resume an adapter (or memory) onto a base other than the one it was trained
    beside: the weights would load and train on as a different function."""
    file = folder / BASE_IDENTITY
    if not file.is_file():  # written since this check exists; older checkpoints lack it
        return
    saved = read_json(file, "Delete that file to resume without the base check.")
    a, b = saved.get("probe", []), base["probe"]
    same = (
        saved.get("model_type") == base["model_type"]
        and len(a) == len(b)
        and all(abs(x - y) <= 1e-2 * max(abs(x), abs(y)) + 1e-4 for x, y in zip(a, b, strict=True))
    )
    if not same:
        was = saved.get("model_name_or_path")
        raise StackWiseError(
            f"The checkpoint '{folder}' was trained on the base '{was}' "
            f"({saved.get('model_type')}), but this run loads '{base['model_name_or_path']}' "
            f"({base['model_type']}), whose weights differ; an adapter only fits the base it was "
            "trained on. Set model.model_name_or_path to that base, or start a new run in "
            "another train.output_dir."
        )


def parameter_size(p: nn.Parameter) -> int:
    """The values a parameter stands for: ZeRO-3 keeps a part here (its whole size aside), and
    a 4-bit weight (bitsandbytes) packs two values in each byte of its storage."""
    if (whole := getattr(p, "ds_numel", None)) is not None:
        return whole
    quant_state = getattr(p, "quant_state", None)
    if quant_state is not None and getattr(quant_state, "shape", None) is not None:
        return quant_state.shape.numel()
    return p.numel()


@register_model_adapter("hf")
class HFAdapter(ModelAdapter):
    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.base: dict[str, Any] = {}
        self.supervised = 0.0  # target tokens of the last step, on every rank

    def build(self, plan: Plan, vocab_size: int) -> nn.Module:
        from stackwise.hf.load import load_base
        from stackwise.hf.lora import attach_lora

        self.plan = plan
        model = load_base(plan, device_now())
        self.base = base_identity(model, plan.model.model_name_or_path or "")
        if plan.lora.enabled:
            model = attach_lora(model, plan)
        if plan.memory_on:
            from stackwise.hf.memory import attach_memory_hf

            attach_memory_hf(model, plan)
        return model

    def adopt(self, model: nn.Module, plan: Plan) -> None:
        """A model of `plan` built outside this adapter (MemoryAdapter(config), or a user's
        own): the plan and base identity that saving and resuming need, as `build` keeps."""
        self.plan = plan
        self.base = base_identity(model, plan.model.model_name_or_path or "")

    def loss(
        self, model: nn.Module, objective: Objective, batch: Batch, gen: Generator, uses_time: bool
    ) -> torch.Tensor:
        routers = memory_layers(model)
        real = batch.get("attention_mask", batch.get("real_tokens"))  # packed: no mask
        with routing_scope(routers, real):
            logits = hf_loss.forward_logits(model, batch)
        nll, _ = hf_loss.target_sums(logits, batch["labels"])
        if model.training and routers:  # a mean per target, as the summed NLL is scaled
            nll = nll + router_loss(routers) * hf_loss.target_count(batch)
        return nll

    def step_metrics(self, model: nn.Module) -> dict[str, float]:
        supervised = {"train/supervised_tokens": self.supervised} if self.supervised else {}
        return memory_metrics(memory_layers(model)) | supervised

    def micro_scales(self, micros: list[dict[str, torch.Tensor]], acc: Any) -> list[float]:
        """1 / (targets in the step's micro-batches on every rank), times the world size that
        DDP's gradient average divides back out. The count is logged: supervised tokens."""
        count = sum(hf_loss.target_count(b) for b in micros)
        total = float(acc.reduce(torch.as_tensor(count, device=acc.device), "sum"))
        self.supervised = total
        return [acc.num_processes / max(total, 1.0)] * len(micros)

    def evaluate(self, model: nn.Module, val_data: Any, acc: Any, tc: Any) -> dict[str, float]:
        from torch.utils.data import DataLoader

        if val_data is None or len(val_data) == 0:
            return {}
        # every row, strided over the ranks (none dropped: one eval row is still scored);
        # the unwrapped model runs no DDP collective, so uneven shares cannot hang
        mine = list(range(acc.process_index, len(val_data), acc.num_processes))
        loader = DataLoader(
            val_data, batch_size=tc.batch_size, sampler=mine, collate_fn=val_data.collate
        )
        model = acc.unwrap_model(model)
        lockstep = None
        if is_sharded_model(model):  # each forward gathers shards: every rank runs as many
            most = -(-len(range(0, len(val_data), acc.num_processes)) // tc.batch_size)
            lockstep = (min(most, tc.eval_batches), val_data.collate([val_data[0]]))
        return hf_loss.evaluate_targets(model, loader, acc, tc.eval_batches, lockstep)

    def named_groups(self, model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
        from stackwise.hf.lora import named_groups

        assert self.plan is not None
        return named_groups(model, self.plan)

    def group_lr(self, name: str, tc: Any) -> float:
        from stackwise.hf.lora import group_lr

        return group_lr(name, tc, self.plan)

    def describe(self, model: nn.Module, plan: Plan) -> str:
        total = sum(parameter_size(p) for p in model.parameters())
        trained = sum(parameter_size(p) for p in model.parameters() if p.requires_grad)
        m = plan.model
        quant = "4-bit " if m.load_in_4bit else "8-bit " if m.load_in_8bit else ""
        how = "LoRA" if plan.lora.enabled else "full fine-tuning"
        if plan.memory_on and not plan.lora.enabled:
            how = "its weights frozen"
        return (
            f"{quant}{Path(m.model_name_or_path or '').name or m.model_name_or_path} with {how}"
            f"{describe_memory(model)}, {trained:,} of {total:,} parameters trained"
        )

    frozen_from_files = True  # the base reloads from model_name_or_path

    def write_identity(self, folder: Path) -> None:
        write_json(folder / BASE_IDENTITY, self.base)

    def check_identity(self, folder: Path) -> None:
        check_base(folder, self.base)

    def save(self, model: nn.Module, folder: Path) -> None:
        """PEFT's own format (adapter_config.json + adapter_model.safetensors), or the whole
        model's save_pretrained; both safetensors."""
        folder.mkdir(parents=True, exist_ok=True)
        assert self.plan is not None
        write_json(folder / BASE_IDENTITY, self.base)
        if self.plan.memory_on:  # the frozen base is not saved again, the memory apart
            save_memory(model, folder)
            if not self.plan.lora.enabled:
                return
        model.save_pretrained(str(folder), safe_serialization=True)

    def load_weights(self, model: nn.Module, folder: Path) -> None:
        try:
            self._load_weights(model, folder)
        except (RuntimeError, OSError, ValueError) as err:  # other shapes, or a damaged file
            raise StackWiseError(
                f"'{folder}' does not match this model ({str(err)[:160]}). It was made with "
                "another base or LoRA settings; resume with its own config."
            ) from None

    def _load_weights(self, model: nn.Module, folder: Path) -> None:
        fix = "Use another checkpoint of the run, or train it again."
        assert self.plan is not None
        if self.plan.lora.enabled or self.plan.memory_on:  # trained beside a frozen base
            check_base(folder, self.base)
        if self.plan.memory_on:
            load_memory(model, folder)
            if not self.plan.lora.enabled:
                return
        if (folder / ADAPTER_WEIGHTS).is_file():
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(model, read_tensors(folder / ADAPTER_WEIGHTS, fix))
            unexpected = getattr(result, "unexpected_keys", [])
        elif (folder / FULL_WEIGHTS).is_file() or (folder / SHARD_INDEX).is_file():
            from transformers.modeling_utils import load_sharded_checkpoint

            if (folder / SHARD_INDEX).is_file():  # a big model, saved in shards
                result = load_sharded_checkpoint(model, str(folder), strict=False)
            else:
                result = model.load_state_dict(
                    read_tensors(folder / FULL_WEIGHTS, fix), strict=False
                )
            unexpected = result.unexpected_keys
            tied = _tied_keys(model)
            missing = [k for k in result.missing_keys if k not in tied]
            if missing:
                raise StackWiseError(
                    f"'{folder}' lacks weights of this model, such as {missing[0]}. Resume with "
                    "the config that wrote it."
                )
        else:
            raise StackWiseError(
                f"'{folder}' holds no adapter or model weights ({ADAPTER_WEIGHTS} or "
                f"{FULL_WEIGHTS}). Resume from a checkpoint folder this run wrote."
            )
        if unexpected:
            raise StackWiseError(
                f"'{folder}' does not match this model (unexpected weights such as "
                f"{unexpected[0]}). It was made with other LoRA settings; resume with its config."
            )

    def final_files(self, model: nn.Module, tokenizer: Any, plan: Plan) -> Any:
        from stackwise.hf.outputs import final_files

        return lambda folder: final_files(folder, model, tokenizer, plan)

    def load(self, folder: Path, read_plan: Any) -> tuple[Any, nn.Module, Any]:
        from stackwise.hf.outputs import load_finetuned

        return load_finetuned(folder, read_plan(folder))
