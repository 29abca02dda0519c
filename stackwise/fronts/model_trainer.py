"""`ModelTrainer`: seed 004's way of fine-tuning a Hugging Face causal LM,
`ModelTrainer(TrainingConfig(model_name_or_path=..., use_lora=True)).train(train_file=...)`.

It runs the real fine-tuning path (stackwise.pipeline.train_from_config with the hf model
adapter: the base loaded, 4/8-bit quantized, LoRA attached by PEFT, the tokenizer's chat
template set) and returns `<output_dir>/final`, the finished model alone (the adapter or the
whole model, tokenizer, generation_config.json), which `PeftModel.from_pretrained` loads. A
peft `LoraConfig` may stand in for the LoRA keys: `ModelTrainer(config, lora_config=...)`.

Run as a module it takes `stackwise finetune`'s flags (seed 004's flat names):
`python -m stackwise.fronts.model_trainer --model_name_or_path DIR --train_file F.json ...`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from stackwise.config import Config, derive, load_config
from stackwise.config.seed_config import TrainingConfig
from stackwise.errors import StackWiseError
from stackwise.fronts.reasoning_data import ReasoningDataset
from stackwise.strategies import RunResult

__all__ = ["ModelTrainer", "ReasoningDataset", "TrainingConfig", "lora_changes", "main"]

FINAL = "final"  # stackwise.hf.outputs writes it at the end of a run
# a peft LoraConfig field -> our key
LORA_KEYS = {
    "r": "lora.rank",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "target_modules": "lora.target_modules",
    "modules_to_save": "lora.modules_to_save",
    "use_dora": "lora.use_dora",
    "use_rslora": "lora.use_rslora",
    "init_lora_weights": "lora.init_lora_weights",
}
# fields PEFT fills in itself, or that our run sets (task_type: CAUSAL_LM, bias: none)
LORA_OWN = {"peft_type", "task_type", "bias", "base_model_name_or_path", "revision"}


def _lora_value(name: str, value: Any) -> Any:
    if name == "target_modules" and isinstance(value, set | frozenset | list | tuple):
        return sorted(value)
    if name == "modules_to_save":
        return list(value or [])
    if name == "init_lora_weights" and isinstance(value, bool):
        return "default" if value else value  # False (no init) is refused by the key's check
    return value


def lora_changes(lora_config: Any) -> dict[str, Any]:
    """A peft LoraConfig as our lora keys (lora.enabled on). A setting StackWise's LoRA does
    not run (bias other than none, another task type, any other field changed from PEFT's
    default) is refused, every one named, rather than dropped."""
    from dataclasses import fields

    from peft import LoraConfig

    if not isinstance(lora_config, LoraConfig):
        raise StackWiseError(
            f"lora_config takes a peft LoraConfig (from peft import LoraConfig), not "
            f"{type(lora_config).__name__}; or set lora_r, lora_alpha, lora_dropout and "
            "lora_target_modules in the TrainingConfig."
        )
    default = LoraConfig()
    unread = [
        f.name
        for f in fields(LoraConfig)
        if f.name not in LORA_KEYS
        and f.name not in LORA_OWN
        and getattr(lora_config, f.name) != getattr(default, f.name)
    ]
    if lora_config.bias != "none":
        unread.insert(0, f"bias={lora_config.bias!r} (StackWise's LoRA trains no biases)")
    task = str(getattr(lora_config.task_type, "value", lora_config.task_type))
    if lora_config.task_type is not None and task != "CAUSAL_LM":
        unread.insert(0, f"task_type={task!r} (ModelTrainer fine-tunes causal LMs: CAUSAL_LM)")
    if unread:
        raise StackWiseError(
            f"The LoraConfig sets {', '.join(unread)}, which ModelTrainer would not apply. "
            "Remove them; it reads r, lora_alpha, lora_dropout, target_modules, "
            "modules_to_save, use_dora, use_rslora and init_lora_weights."
        )
    changes = {key: _lora_value(n, getattr(lora_config, n)) for n, key in LORA_KEYS.items()}
    return {"lora.enabled": True, **changes}


def _as_config(config: Any) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return TrainingConfig(**config)
    if isinstance(config, str | Path):
        return load_config(config)
    raise StackWiseError(
        f"ModelTrainer takes a TrainingConfig (or a Config, a dict of its keys, or a config "
        f"file), not {type(config).__name__}."
    )


class ModelTrainer:
    """Fine-tunes the Hugging Face model of `config` (see the module's docstring)."""

    def __init__(self, config: Any, lora_config: Any = None) -> None:
        config = _as_config(config)
        if config.model.source != "hf":
            raise StackWiseError(
                "ModelTrainer fine-tunes a Hugging Face model, and this config builds a "
                "StackWise rack (model.source: rack). Give model_name_or_path (a local model "
                "folder) in the TrainingConfig, or train the rack with Trainer(config)."
            )
        if lora_config is not None:
            if config.lora.changed("enabled") and not config.lora.enabled:
                raise StackWiseError(
                    "ModelTrainer got a lora_config while the config says use_lora=False; "
                    "drop one of them."
                )
            config = derive(config, lora_changes(lora_config), "ModelTrainer(lora_config=...)")
        self.config = config
        self.result: RunResult | None = None

    def train(
        self, train_file: str | Path | None = None, eval_file: str | Path | None = None
    ) -> str:
        """Fine-tune on `train_file` (default: the config's data), evaluating on `eval_file`
        (default: a held-out part of the training rows); returns `<output_dir>/final`."""
        from stackwise.pipeline import train_from_config

        changes: dict[str, Any] = {}
        if train_file is not None:
            changes["data.files"] = [str(train_file)]
        if eval_file is not None:
            changes["data.eval_files"] = [str(eval_file)]
        config = derive(self.config, changes, "ModelTrainer.train")  # re-checks attribute edits
        self.result = train_from_config(config)
        final = self.result.output_dir / FINAL
        return str(final if final.is_dir() else self.result.output_dir)

    def _done(self) -> RunResult:
        if self.result is None:
            raise StackWiseError("The model is loaded by train(); call trainer.train() first.")
        return self.result

    @property
    def model(self) -> Any:
        """The trained model: the PEFT model (base and adapter), or the whole model."""
        return self._done().rack

    @property
    def tokenizer(self) -> Any:
        return self._done().data.tokenizer

    @property
    def output_dir(self) -> Path:
        return self._done().output_dir


USAGE = (
    "usage: python -m stackwise.fronts.model_trainer --model_name_or_path DIR --train_file F "
    "[--eval_file F] [--output_dir DIR] [--config FILE] [--flag value ...] [key=value ...]\n"
    "The flags of `stackwise finetune` (seed 004's names): {flags}."
)


def main(argv: list[str] | None = None) -> int:
    """The module's command line; errors print one paragraph and exit 2."""
    from stackwise.fronts.finetune_flags import FLAGS, PRECISION_FLAGS, finetune_config, in_flags
    from stackwise.launcher import without_launcher_rank
    from stackwise.quiet import filter_library_noise

    args = without_launcher_rank(sys.argv[1:] if argv is None else [str(a) for a in argv])
    if {"-h", "--help"} & set(args):
        print(USAGE.format(flags=", ".join(f"--{n}" for n in [*FLAGS, *PRECISION_FLAGS])))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    filter_library_noise()
    try:
        trainer = ModelTrainer(finetune_config(args))
        final = trainer.train()
    except StackWiseError as err:
        if hasattr(err, "resume_command"):  # a stop signal: the work is saved
            print(
                f"stackwise: stopped by {err.signal_name} {err.where}; {err.checkpoint} holds "
                f"the work. To resume:\n  {err.resume_command(args, 'finetune')}",
                file=sys.stderr,
            )
            return 143 if err.signal_name == "SIGTERM" else 130
        said = in_flags(str(err), args)
        print(f"stackwise: error: {' '.join(said.split())}", file=sys.stderr)
        return 2
    if "torch.distributed" in sys.modules:
        from stackwise.train.hardware import release_processes

        release_processes()
    if os.environ.get("RANK", "0") == "0":
        print(f"Saved the fine-tuned model to {trainer.output_dir}; the final model: {final}")
    return 0


if __name__ == "__main__":
    from stackwise.launcher import leave

    leave(main())  # a launched process exits without gloo's teardown abort
