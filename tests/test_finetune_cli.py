"""`stackwise finetune`, `generate --chat`, `merge-lora` and `data preview` on fine-tuned runs."""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml
from hf_fixtures import chat_file, tiny_hf

from stackwise.cli import main
from stackwise.cli.finetune import finetune_config
from stackwise.errors import StackWiseError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ftcli")
    return {
        "model": tiny_hf(root / "m"),
        "chat": chat_file(root / "c.jsonl", n=24),
        "eval": chat_file(root / "e.jsonl", n=4, seed=5),
        "root": root,
    }


def seed_flags(files, out, max_steps: int | None = None) -> list[str]:
    """The seed's command line; one epoch, or `max_steps` steps."""
    budget = ["--max_steps", str(max_steps)] if max_steps else ["--num_train_epochs", "1"]
    return [
        "--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"]),
        "--eval_file", str(files["eval"]), "--use_lora", "True", *budget,
        "--learning_rate", "2e-3", "--train_batch_size", "4", "--gradient_accumulation_steps",
        "2", "--output_dir", str(out), "--max_seq_length", "128",
    ]  # fmt: skip


def test_seed_flags_and_file_keys_become_the_config(files, tmp_path):
    cfg_file = tmp_path / "ft.json"
    cfg_file.write_text(
        json.dumps(
            {
                "lora_r": 4,
                "lora_alpha": 8,
                "warmup_ratio": 0.1,
                "lr_scheduler_type": "linear",
                "early_stopping_patience": 2,
                "use_wandb": False,
                "bf16": True,
                "learning_rate": 1e-5,  # the flag below wins
                "logging": {"log_every": 3},
            }
        )
    )
    cfg = finetune_config([*seed_flags(files, tmp_path / "o"), "--config", str(cfg_file)])
    assert cfg.model.source == "hf" and cfg.data.mode == "instruction" and cfg.lora.enabled
    assert cfg.data.files == [str(files["chat"])] and cfg.data.eval_files == [str(files["eval"])]
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.train.lr) == (4, 8.0, 2e-3)
    assert cfg.train.warmup_ratio == 0.1 and cfg.train.scheduler == "linear"
    assert cfg.train.early_stopping_patience == 2 and cfg.train.mixed_precision == "bf16"
    assert cfg.train.num_train_epochs == 1.0 and cfg.train.grad_accum_steps == 2
    assert cfg.logging.log_every == 3 and cfg.data.seq_len == 128
    yaml_file = tmp_path / "ft.yaml"
    yaml_file.write_text(yaml.safe_dump({"fp16": True}))
    assert (
        finetune_config(
            [*seed_flags(files, tmp_path), "--config", str(yaml_file)]
        ).train.mixed_precision
        == "fp16"
    )


def test_a_bad_flag_gets_the_nearest_one(files, capsys):
    assert (
        main(["finetune", "--model_name_or_path", str(files["model"]), "--lerning_rate", "1"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        "Unknown flag --lerning_rate" in err and "--learning_rate" in err and "Traceback" not in err
    )


def test_finetune_then_chat_merge_and_preview(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    flags = [*seed_flags(files, out), "--bf16", "False"]  # an fp32 base: the merge is exact
    assert main(["finetune", *flags, "sample.num_samples=1", "sample.max_new_tokens=4"]) == 0
    printed = capsys.readouterr().out
    assert "--- sample 1 ---\nuser: Repeat:" in printed and "--chat" in printed
    assert (out / "adapter_model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(out),
                "--chat",
                "Repeat: sun",
                "--temperature",
                "0",
                "--max-new-tokens",
                "5",
            ]
        )
        == 0
    )
    reply = capsys.readouterr().out.strip()
    assert reply and (len(reply) <= 5 * 8 or reply.startswith("(an empty reply"))
    assert main(["generate", "--checkpoint", str(out), "--prompt", "x"]) == 2
    assert "--chat" in capsys.readouterr().err
    merged = tmp_path / "merged"
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert main(["merge-lora", str(out), str(merged)]) == 0
    if not torch.cuda.is_available():  # DeepSpeed is told it runs on the CPU, not left to warn
        assert os.environ.get("DS_ACCELERATOR") == "cpu"
    text = capsys.readouterr().out
    drift = float(text.split("max |diff| ")[1].split(" ")[0])
    assert drift < 1e-4  # fp32 base: merging is exact up to rounding
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.randint(4, 200, (1, 10))
    plain = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(files["model"])), str(out)
    ).eval()
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-4)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"source": "hf", "model_name_or_path": str(files["model"])},
                "data": {"mode": "instruction", "files": [str(files["chat"])], "seq_len": 128},
                "lora": {"enabled": True},
            }
        )
    )
    assert main(["data", "preview", str(cfg), "--index", "1"]) == 0
    shown = capsys.readouterr().out
    assert "[[" in shown and "<eos>]]" in shown and "target tokens" in shown


def test_qlora_merges_into_the_dequantized_base(files, tmp_path, capsys):
    out = tmp_path / "q"
    flags = [*seed_flags(files, out, max_steps=2), "--load_in_4bit", "True"]
    assert main(["finetune", *flags, "lora.save_merged=true", "sample.num_samples=0"]) == 0
    assert (out / "merged" / "model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged"))
    assert not any("4bit" in type(m).__name__ for m in merged.modules())
    capsys.readouterr()
    assert main(["merge-lora", str(out), str(tmp_path / "m2")]) == 0
    drift = float(capsys.readouterr().out.split("max |diff| ")[1].split(" ")[0])
    assert drift < 0.05  # the 4-bit path computes in bf16; the merged model in fp32


def test_checkpoints_full_tuning_and_remote_code(files, tmp_path, capsys):
    """A checkpoint folder chats with the run's tokenizer; a full fine-tune has nothing to
    merge; a run that trusted remote code is loaded only with --trust-remote-code."""
    out = tmp_path / "full"
    flags = [*seed_flags(files, out, max_steps=2), "--use_lora", "False", "--save_steps", "1"]
    assert main(["finetune", *flags, "sample.num_samples=0"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(out / "checkpoint-1"),
                "--chat",
                "hi",
                "--max-new-tokens",
                "2",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip()
    assert main(["merge-lora", str(out), str(tmp_path / "m")]) == 2
    assert "no adapter to merge" in capsys.readouterr().err
    config = out / "config.yaml"
    config.write_text(
        config.read_text().replace("trust_remote_code: false", "trust_remote_code: true")
    )
    assert main(["generate", "--checkpoint", str(out), "--chat", "hi"]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(out),
                "--chat",
                "hi",
                "--max-new-tokens",
                "2",
                "--trust-remote-code",
            ]
        )
        == 0
    )


def test_what_a_new_user_got_wrong_gets_one_paragraph(files, tmp_path, capsys):
    """The tester's cases: bad sampling flags, a flag without its value, a file that sets a
    key twice, a non-UTF-8 or empty data file, merging into a full folder."""
    cfg = finetune_config(
        ["--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"])]
    )
    assert cfg.train.lr == 2e-4 and cfg.train.num_train_epochs == 1.0  # finetune's defaults
    with pytest.raises(StackWiseError, match="--learning_rate needs a value"):
        finetune_config(["--learning_rate", "--max_steps", "2"])
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"lora_r": 4, "lora": {"rank": 8}}))
    with pytest.raises(StackWiseError, match=r"sets lora\.rank twice"):
        finetune_config([*seed_flags(files, tmp_path / "t"), "--config", str(twice)])
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9", "response": "ok"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    for bad, words in ((latin, "not UTF-8"), (empty, "is empty")):
        flags = ["finetune", "--model_name_or_path", str(files["model"]), "--train_file", str(bad)]
        assert main([*flags, "--output_dir", str(tmp_path / bad.stem)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    out = tmp_path / "run"
    flags = [*seed_flags(files, out, max_steps=1), "--lora_target_modules", "q_proj"]
    assert main(["finetune", *flags, "sample.num_samples=0"]) == 0
    capsys.readouterr()
    for bad_flags, words in (
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--top-k", "-1"], "--top-k"),
        (["--prompt", "x"], "not both"),
    ):
        assert main(["generate", "--checkpoint", str(out), "--chat", "hi", *bad_flags]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("keep me")
    assert main(["merge-lora", str(out), str(full)]) == 2
    assert (
        "never overwrites" in capsys.readouterr().err
        and (full / "notes.txt").read_text() == "keep me"
    )


def test_a_precision_flag_takes_only_true_or_false(files, tmp_path):
    """`--bf16 maybe` used to fall through to mixed_precision auto: a typo trained anyway."""
    base = ["--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"])]
    for value in ("maybe", "2"):
        with pytest.raises(StackWiseError, match=r"bf16 the value .* takes true or false"):
            finetune_config([*base, "--bf16", value])
    assert finetune_config([*base, "--bf16", "false"]).train.mixed_precision == "no"
    assert finetune_config([*base, "--bf16"]).train.mixed_precision == "bf16"
    for text, want in (('fp16: "False"', "no"), ("bf16: 1", "bf16")):  # a file reads alike
        file = tmp_path / "precision.yaml"
        file.write_text(text + "\n")
        cfg = finetune_config([*base, "--config", str(file)])
        assert cfg.train.mixed_precision == want, text


def test_export_hf_on_a_fine_tuned_run_points_at_merge_lora(files, tmp_path, capsys):
    out = tmp_path / "run"
    flags = seed_flags(files, out, max_steps=1)
    assert main(["finetune", *flags, "sample.num_samples=0"]) == 0
    capsys.readouterr()
    assert main(["export-hf", str(out), str(tmp_path / "x")]) == 2
    assert "merge-lora" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_finetune_errors_name_the_flags_typed(files, tmp_path, capsys):
    flags = ["--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"])]
    flags += ["--train_batch_size", "1000", "--max_steps", "3", "--output_dir", str(tmp_path / "o")]
    assert main(["finetune", *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the paragraph is wrapped at 100 columns
    assert "--train_batch_size (train.batch_size)=1000" in err


def test_a_finetune_file_previews_and_its_typos_are_all_named(files, tmp_path, capsys):
    """`data preview` reads a `finetune --config` file (flat seed keys); --index counts
    examples even when packing lays them into fewer rows; every unknown key of such a file is
    named at once with its nearest flat name."""
    flat = {
        "model_name_or_path": str(files["model"]),
        "train_file": str(files["chat"]),
        "max_seq_length": 128,
        "packing": True,
    }
    good = tmp_path / "ft.json"
    good.write_text(json.dumps(flat))
    last = 20  # of the ~22 training examples of chat_file(n=24); packed, they fill ~5 rows
    assert main(["data", "preview", str(good), "--index", str(last)]) == 0
    shown = capsys.readouterr().out
    assert f"--- example {last};" in shown and "[[" in shown and "data.packing lays" in shown
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**flat, "lora_rr": 8, "learnin_rate": 1e-3}))
    for argv in (["data", "preview", str(bad)], ["finetune", "--config", str(bad)]):
        assert main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())  # the message is wrapped to the terminal
        assert "2 unknown key(s)" in err and "Traceback" not in err
        assert "'lora_rr' (did you mean 'lora_r'?)" in err and "'learning_rate'" in err


def test_generate_help_on_a_fine_tuned_run_speaks_of_the_model(files, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", *seed_flags(files, out, max_steps=1)]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(out), "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "this model is causal" in shown and "this rack" not in shown
    assert "a fine-tuned model takes --chat QUESTION" in shown


def test_flags_and_overrides_win_over_the_config_file(files, tmp_path):
    """A flag replaces the --config file's key, and its alternative too: `--max_steps` over the
    file's num_train_epochs (or max_steps); a dotted override wins over both."""
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text(
        "num_train_epochs: 3\nlearning_rate: 1.0e-3\ntrain: {warmup_ratio: 0.1}\nlora: {rank: 4}\n"
    )
    base = ["--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"])]
    cfg = finetune_config([*base, "--config", str(cfg_file), "--max_steps", "5"])
    assert (cfg.train.max_steps, cfg.train.num_train_epochs, cfg.train.lr) == (5, None, 1e-3)
    cfg = finetune_config(
        [*base, "--max_steps", "5", "--config", str(cfg_file), "--warmup_steps", "2",
         "--lora_r", "16", "train.max_steps=7", "eval_steps=3"]
    )  # fmt: skip
    assert (cfg.train.max_steps, cfg.train.warmup_steps, cfg.train.warmup_ratio) == (7, 2, None)
    assert cfg.lora.rank == 16 and cfg.train.eval_every == 3
    cfg_file.write_text("max_steps: 10\n")
    cfg = finetune_config([*base, "--config", str(cfg_file), "--num_train_epochs", "2"])
    assert cfg.train.num_train_epochs == 2 and "max_steps" not in cfg.train.model_fields_set


@pytest.mark.parametrize(
    ("flag", "override"),
    [
        (["--max_steps", "5"], "train.num_train_epochs=2"),
        (["--warmup_steps", "5"], "train.warmup_ratio=0.1"),
        (["--load_in_4bit", "True"], "model.load_in_8bit=true"),
    ],
)
def test_a_flag_and_an_override_that_replace_each_other_are_refused(files, flag, override):
    """Neither may silently drop the other (an override used to discard the flag)."""
    base = ["--model_name_or_path", str(files["model"]), "--train_file", str(files["chat"])]
    with pytest.raises(StackWiseError, match="replace each other") as caught:
        finetune_config([*base, *flag, override])
    assert flag[0] in str(caught.value) and override.split("=")[0] in str(caught.value)


@pytest.mark.parametrize("gpu", [False, True])
def test_deepspeed_is_told_of_the_cpu_only_without_a_gpu(monkeypatch, gpu):
    from stackwise.quiet import quiet_deepspeed_without_gpu

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    quiet_deepspeed_without_gpu()
    assert os.environ.get("DS_ACCELERATOR") == (None if gpu else "cpu")
