"""The baseline of benchmarks/finetune.py: a hand-written transformers.Trainer + PEFT script, as a
user would write it, with assistant-only labels and the same hyperparameters as our run.

Usage: python benchmarks/hf_trainer_baseline.py MODEL TRAIN.jsonl EVAL.jsonl OUT {lora,qlora} SEED
Prints one JSON line: supervised tokens trained, tokens run (padding included), train_runtime,
eval loss per target token.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        BitsAndBytesConfig,
        DataCollatorForSeq2Seq,
        Trainer,
        TrainingArguments,
    )

    model_dir, train_file, eval_file, out, mode, seed = sys.argv[1:7]
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(model_dir)

    def encode(row: dict) -> dict:
        """Prompt tokens masked (-100), reply and its end-of-turn token trained."""
        chat = [{"role": "user", "content": row["prompt"]}]
        prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(
            [*chat, {"role": "assistant", "content": row["completion"]}], tokenize=False
        )
        ids = tok(full, add_special_tokens=False)["input_ids"][:512]
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        labels = [-100] * n_prompt + ids[n_prompt:]
        labels[0] = -100
        if ids[-1] != tok.eos_token_id and ids[-2] == tok.eos_token_id:  # the template's "\n"
            labels[-1] = -100
        return {"input_ids": ids, "labels": labels[: len(ids)]}

    rows = [json.loads(x) for x in Path(train_file).read_text().splitlines()]
    evals = [json.loads(x) for x in Path(eval_file).read_text().splitlines()]
    train = [encode(r) for r in rows]
    val = [encode(r) for r in evals]
    kwargs: dict = {"dtype": torch.bfloat16}
    if mode == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if mode == "qlora":  # the usual recipe (it casts the non-quantized weights to fp32)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(
        model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
    )
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        num_train_epochs=1,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=True,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=50,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        seed=int(seed),
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100)
    padded = [0]

    def counting(rows: list[dict]) -> dict:
        """The same collator, counting the tokens the model runs (padding included)."""
        batch = collator(rows)
        padded[0] += batch["input_ids"].numel()
        return batch

    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=counting)
    result = trainer.train()
    model.eval()
    total = count = 0.0
    with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16):
        for i in range(0, len(val), 4):
            batch = collator(val[i : i + 4])
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            targets = batch["labels"][:, 1:]
            total += float(
                torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.size(-1)),
                    targets.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
            )
            count += float((targets != -100).sum())
    supervised = sum(sum(1 for x in r["labels"][1:] if x != -100) for r in train)
    print(
        json.dumps(
            {
                "supervised_tokens": supervised,
                "padded_tokens": padded[0],
                "train_runtime": result.metrics["train_runtime"],
                "eval_loss": total / count,
                "wall": time.perf_counter() - start,
            }
        )
    )


if __name__ == "__main__":
    main()
