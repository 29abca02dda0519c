"""The subcommands and branches of Hugging Face fine-tuning: `finetune`, `data preview`,
`generate --chat`, and `merge-lora` on a fine-tuned run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from stackwise.cli.common import printable
from stackwise.config.rules_cross import MASKED_SAMPLING, SAMPLER_OWN
from stackwise.errors import StackWiseError


def cmd_finetune(ns: argparse.Namespace) -> int:
    """Fine-tune a Hugging Face causal LM with LoRA (default) or QLoRA on chat/instruction data:
    the seed's flags (--model_name_or_path DIR --train_file F.jsonl [--eval_file E.jsonl]
    --use_lora True --load_in_4bit True --num_train_epochs 3 --learning_rate 2e-4
    --train_batch_size 1 --gradient_accumulation_steps 4 --output_dir OUT [--config F]),
    then dotted key=value overrides. Flags override the --config file (JSON or YAML, with the
    same flat names or our sections)."""
    from stackwise.cli.common import run_summary
    from stackwise.cli.finetune import finetune_config

    try:
        config = finetune_config(ns.args)  # bad flags are refused before torch loads
        from stackwise.pipeline import train_from_config

        start = time.monotonic()
        result = train_from_config(config)
    except StackWiseError as err:
        if hasattr(err, "resume_command"):  # a stop signal: main() says how to resume
            raise
        from stackwise.fronts.finetune_flags import in_flags

        raise StackWiseError(in_flags(str(err), ns.args)) from None
    if not result.trainer.accelerator.is_main_process:
        return 0
    print(f"Saved the fine-tuned model to {result.output_dir}")
    show_replies(result, config.sample.num_samples)
    print(run_summary(result, time.monotonic() - start))
    return 0


def show_replies(result: Any, n: int) -> None:
    """A fine-tuned model's replies to the first evaluation conversations (or sample.prompt)."""
    from stackwise.generate import chat_reply
    from stackwise.hf.chat import questions, reply

    plan = result.config  # the run's Plan
    for i, convo in enumerate(questions(result.data, n, plan.sample.prompt)):
        if plan.model.source == "hf":
            answer = reply(result.rack, result.data.tokenizer, convo, plan.sample, seed=i)
        else:
            answer = chat_reply(plan, result.rack.eval(), result.data.tokenizer, convo, seed=i)
        print(f"--- sample {i + 1} ---\n{convo[-1]['role']}: {convo[-1]['content']}")
        print(f"assistant: {printable(answer.strip())}")


def _saved_config(folder: str | Path) -> dict:
    import yaml

    path = Path(folder)
    for cfg in (path / "config.yaml", path.parent / "config.yaml"):
        if cfg.is_file():
            return yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}
    return {}


def is_finetuned(folder: str | Path) -> bool:
    """Whether a run folder (or one of its checkpoints) holds a Hugging Face fine-tune."""
    return (_saved_config(folder).get("model") or {}).get("source") == "hf"


def trained_on_chat(folder: str | Path) -> bool:
    return (_saved_config(folder).get("data") or {}).get("mode") == "instruction"


def generate_chat(ns: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """`generate` on a fine-tuned run: a reply to --chat, rendered with the run's template."""
    if ns.chat is None:
        raise StackWiseError(
            f"'{ns.checkpoint}' is a fine-tuned chat model: ask it with --chat \"question\" "
            "(the question is rendered with its chat template)."
        )
    masked = [k for k in (*MASKED_SAMPLING, *SAMPLER_OWN) if overrides.get(k) is not None]
    if masked:
        flag = "--" + masked[0].replace("_", "-")
        raise StackWiseError(f"{flag} applies to masked racks; a causal LM replies left to right.")
    if ns.prompt is not None:
        raise StackWiseError("Give --chat or --prompt, not both: --chat asks a fine-tuned model.")
    from stackwise.hf.chat import reply  # after the flags' checks: torch takes seconds to load
    from stackwise.runs import config_of, load_finetuned

    plan, model, tok = load_finetuned(Path(ns.checkpoint), ns.trust_remote_code)
    config = checked_sampling(config_of(plan), overrides)
    for i in range(ns.num_samples):
        text = reply(model, tok, ns.chat, config.sample, seed=ns.seed + i)
        if ns.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        print(printable(text.strip()) or "(an empty reply: the model ended its turn at once)")
    return 0


def rack_chat(
    ns: argparse.Namespace, config: Any, rack: Any, tok: Any, overrides: dict[str, Any]
) -> int:
    """`generate --chat` on a rack trained on instruction rows."""
    from stackwise.generate import chat_reply
    from stackwise.plan import compile_plan

    if config.data.mode != "instruction" or not getattr(tok, "chat_template", None):
        raise StackWiseError(
            "--chat renders a question with the chat template of a model trained on "
            "instruction data; this rack was trained on plain text: sample it with --prompt."
        )
    if ns.prompt is not None:
        raise StackWiseError("Give --chat or --prompt, not both: --chat asks the trained model.")
    messages = [{"role": "user", "content": ns.chat}]
    checked_sampling(config, overrides)
    plan = compile_plan(config)
    for i in range(ns.num_samples):
        if ns.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        text = chat_reply(plan, rack, tok, messages, ns.seed + i, **overrides).strip()
        print(printable(text) or "(an empty reply: the model ended its turn at once)")
    return 0


def checked_sampling(config: Any, overrides: dict[str, Any]) -> Any:
    """The run's config with the sampling flags applied and validated like any config key,
    each error naming the flag that was typed."""
    from stackwise.config import derive

    changes = {f"sample.{k}": v for k, v in overrides.items() if v is not None}
    try:
        return derive(config, changes, "the sampling flags")
    except StackWiseError as err:
        message = str(err)
        for name in overrides:
            message = message.replace(f"sample.{name}", f"--{name.replace('_', '-')}")
        raise StackWiseError(message) from None


def merge_finetuned(ns: argparse.Namespace) -> int:
    from stackwise.runs import merge_finetuned as merge_run

    if ns.requantize:
        raise StackWiseError(
            "--requantize applies to rack stacks; a merged HF model is saved plain."
        )
    out = Path(ns.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StackWiseError(
            f"'{out}' exists and is not an empty folder; merge-lora never overwrites. Pick a new "
            "folder for OUT."
        )
    from stackwise.quiet import quiet_deepspeed_without_gpu

    quiet_deepspeed_without_gpu()
    report = merge_run(Path(ns.checkpoint), out, ns.trust_remote_code)
    print(
        f"Merged the LoRA adapter of {ns.checkpoint} into its base (dequantized where it was "
        f"quantized) and saved {ns.out} in {report['dtype']}, the dtype the base trained in "
        f"(model.dtype; auto follows the training precision).\nLogits vs "
        f"base + adapter: max |diff| {report['max_logit_drift']:.3g} (largest logit "
        f"{report['logit_scale']:.3g})."
    )
    return 0


def cmd_data(ns: argparse.Namespace) -> int:
    """preview CONFIG [key=value ...]: render the first instruction example (or --index N) with
    its training targets marked [[like this]], and count what the data holds."""
    from stackwise.chat.build import build_chat_data
    from stackwise.chat.preview import marked
    from stackwise.cli.common import load_args
    from stackwise.cli.finetune import finetune_config, is_finetune_file
    from stackwise.pipeline import instruction_tokenizer
    from stackwise.plan import compile_plan

    if ns.args and is_finetune_file(ns.args[0]):  # the flat keys of a `finetune --config`
        config = finetune_config(["--config", ns.args[0], *ns.args[1:]])
    else:
        config = load_args(ns.args)
    if config.data.mode != "instruction":
        raise StackWiseError(
            "data preview shows the targets of instruction data; this config has "
            "data.mode: pretraining, where every token is a target."
        )
    packed = config.data.packing  # --index counts examples, one per row, packed or not
    plan = compile_plan(config).with_section("data", packing=False)
    data = build_chat_data(plan, instruction_tokenizer(config))
    rows = data.train
    if not 0 <= ns.index < len(rows):
        raise StackWiseError(
            f"--index {ns.index} is out of range: there are {len(rows)} training examples "
            f"(0 to {len(rows) - 1})."
        )
    row = rows[ns.index]
    print(marked(data.tokenizer, row["input_ids"].tolist(), row["labels"].tolist()))
    laid = "; data.packing lays the examples end to end in rows of data.seq_len" if packed else ""
    print(f"--- example {ns.index}; {data.describe}{laid}")
    return 0
