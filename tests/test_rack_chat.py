"""Racks on instruction data: causal LM or masked diffusion with LLaDA's SFT recipe (the prompt
is never masked, the loss is per reply token), through the same Trainer and CLI."""

from __future__ import annotations

import pytest
import torch
import yaml
from hf_fixtures import chat_file

from stackwise.cli import main
from stackwise.config import from_dict
from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE


def rack_dict(chat, out, **sections) -> dict:
    base = {
        "model": {
            "n_stacks": 1,
            "blocks_per_stack": 2,
            "d_model": 32,
            "n_heads": 2,
            "max_seq_len": 128,
        },
        "data": {"mode": "instruction", "files": [str(chat)], "seq_len": 128, "tokenizer": "byte"},
        "objective": {"name": "diffusion"},
        "train": {
            "max_steps": 3,
            "batch_size": 4,
            "eval_every": 3,
            "eval_batches": 1,
            "output_dir": str(out),
            "mixed_precision": "no",
        },
        "logging": {"tensorboard": False, "progress_bar": "never"},
        "sample": {"num_samples": 1, "max_new_tokens": 8, "steps": 4},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    if base["objective"]["name"] == "clm":
        base["sample"].pop("steps")
    return base


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return chat_file(tmp_path_factory.mktemp("rackchat") / "c.jsonl", n=24)


def batch_of(chat, tmp_path, objective):
    from stackwise.pipeline import prepared

    cfg, data = prepared(from_dict(rack_dict(chat, tmp_path / "d", objective={"name": objective})))
    rows = data.train
    return cfg, data, rows.collate([rows[i] for i in range(8)])


def test_diffusion_never_masks_the_prompt_and_counts_reply_tokens(chat, tmp_path):
    from stackwise.objectives import build_objective

    cfg, data, batch = batch_of(chat, tmp_path, "diffusion")
    objective = build_objective(cfg, data.specials)
    reply = batch["labels"] != IGNORE
    seen = torch.zeros_like(reply)
    for seed in range(20):
        prep = objective.prepare(batch, torch.Generator().manual_seed(seed))
        masked = prep.inputs == data.specials.mask_id
        assert not (masked & ~reply).any()  # no prompt or padding position is ever hidden
        assert int(prep.normalizer) == int(reply.sum())  # per reply token
        seen |= masked
    assert seen[reply].float().mean() > 0.9  # while every reply position does get masked


def test_clm_targets_are_the_replies(chat, tmp_path):
    from stackwise.objectives import build_objective

    cfg, data, batch = batch_of(chat, tmp_path, "clm")
    prep = build_objective(cfg, data.specials).prepare(batch, torch.Generator())
    assert torch.equal(prep.targets[:, :-1], batch["labels"][:, 1:])


def test_accumulation_matches_one_big_batch(chat, tmp_path):
    from stackwise.objectives import build_objective
    from stackwise.pipeline import prepared
    from stackwise.pipeline import trainer_for as Trainer
    from stackwise.train.adapters import RackAdapter

    grads = []
    for batch, accum in ((4, 1), (1, 4)):
        train = {"batch_size": batch, "grad_accum_steps": accum, "max_grad_norm": 0.0}
        cfg, data = prepared(
            from_dict(
                rack_dict(chat, tmp_path / f"a{batch}", objective={"name": "clm"}, train=train)
            )
        )
        torch.manual_seed(0)
        rack = RackAdapter().build(cfg, len(data.tokenizer))
        trainer = Trainer(cfg, rack, build_objective(cfg, data.specials), data.train, data.val)
        trainer.optimizer.step = lambda *a, **k: None
        trainer.optimizer.zero_grad = lambda *a, **k: None
        trainer.optimizer_step(trainer.batches())
        grads.append({n: p.grad.clone() for n, p in rack.named_parameters() if p.grad is not None})
    assert grads[0]
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-4, atol=1e-7), name


def test_train_and_chat_from_the_cli(chat, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(rack_dict(chat, tmp_path / "run")))
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "--- sample 1 ---\nuser: Repeat:" in out and "--chat" in out
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(tmp_path / "run"),
                "--chat",
                "Repeat: sun",
                "--steps",
                "4",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip()


def test_rack_chat_settings_that_cannot_work_are_refused(chat, tmp_path):
    for sections, words in (
        ({"data": {"tokenizer": None}}, "needs data.tokenizer"),
        ({"data": {"packing": True}}, "attends across packed"),
        ({"data": {"padding_free": True}}, "attends across the examples"),
        ({"objective": {"name": "mlm"}}, "use block_diffusion or clm or diffusion"),
    ):
        data = rack_dict(chat, tmp_path / "r", **sections)
        with pytest.raises(StackWiseError, match=words):
            from_dict(data)
