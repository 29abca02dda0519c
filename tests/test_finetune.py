"""Fine-tuning Hugging Face causal LMs with LoRA/QLoRA through the Trainer, on chat data."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from hf_fixtures import chat_file, hf_config, tiny_hf

from stackwise.config import derive
from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config
from stackwise.report import write_report


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        "llama": tiny_hf(root / "llama"),
        "qwen2": tiny_hf(root / "qwen2", kind="qwen2"),
        "untied": tiny_hf(root / "untied", tied=False),
        "chat": chat_file(root / "chat.jsonl", n=40),
        "root": root,
    }


def lora_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_lora_run_writes_a_peft_adapter_that_peft_loads(hf, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = tmp_path / "run"
    res = train_from_config(hf_config(hf["llama"], hf["chat"], out))
    assert res.state.step == 4 and res.state.history[-1]["loss"] > 0
    for name in ("adapter_config.json", "adapter_model.safetensors", "config.yaml"):
        assert (out / name).is_file(), name
    tok = AutoTokenizer.from_pretrained(str(out))
    assert "generation" in tok.chat_template  # our default template, saved with the run
    gen = GenerationConfig.from_pretrained(str(out))
    assert tok.eos_token_id in (
        gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    )
    base = AutoModelForCausalLM.from_pretrained(str(hf["llama"]))
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.randint(4, 200, (2, 12))
    res.rack.eval()
    with torch.no_grad():
        assert torch.allclose(
            loaded(input_ids=ids).logits, res.rack(input_ids=ids).logits, atol=1e-5
        )
    trained = [n for n, p in res.rack.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    page = write_report([out]).read_text(encoding="utf-8")  # the run's report shows its adapter
    assert 'id="run-0-adapter"' in page and "lora_alpha" in page
    assert 'id="plot-loss"' in page and 'id="plot-supervised"' in page


def chat_data(cfg):
    from stackwise.chat.build import build_chat_data
    from stackwise.hf.load import load_tokenizer

    return build_chat_data(cfg, load_tokenizer(cfg.model.model_name_or_path, False))


def test_loss_is_normalized_over_the_whole_accumulated_batch(hf, tmp_path):
    """batch 1 x accumulation 4 gives the gradient of batch 4 (examples of unequal length)."""
    from stackwise.hf.adapter import HFAdapter
    from stackwise.objectives import build_objective
    from stackwise.pipeline import trainer_for

    grads = []
    for batch, accum in ((4, 1), (1, 4)):
        train = {"batch_size": batch, "grad_accum_steps": accum, "max_steps": 1}
        cfg = hf_config(hf["llama"], hf["chat"], tmp_path / f"b{batch}", train=train)
        data = chat_data(cfg)
        adapter = HFAdapter()
        torch.manual_seed(0)  # the same LoRA A in both runs
        model = adapter.build(cfg, 0)
        for n, p in model.named_parameters():  # B = 0 at init would zero A's gradient
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(1))
        objective = build_objective(cfg, data.specials)
        trainer = trainer_for(cfg, model, objective, data.train, data.val, adapter=adapter)
        trainer.optimizer.step = lambda *a, **k: None  # keep the gradients to compare
        trainer.optimizer.zero_grad = lambda *a, **k: None
        trainer.optimizer_step(trainer.batches())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0]
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-4, atol=1e-7), name


def test_packed_and_padding_free_losses_equal_padded(hf):
    """Attention never crosses examples laid in one row (SDPA on CPU): padded, padding-free
    and packed batches of the same examples give the same summed loss and gradients."""
    from stackwise.hf import loss as hf_loss
    from stackwise.hf.load import load_base

    sums, grads = [], []
    layouts = [{"padding_free": False}, {"padding_free": True}, {"packing": True}]
    for layout in layouts:
        cfg = hf_config(
            hf["llama"], hf["chat"], hf["root"] / "unused", data={**layout, "seq_len": 128}
        )
        data = chat_data(cfg)
        torch.manual_seed(0)
        model = load_base(cfg, torch.device("cpu")).eval()
        rows = data.train
        batch = rows.collate([rows[i] for i in range(len(rows))])
        nll, _ = hf_loss.target_sums(hf_loss.forward_logits(model, batch), batch["labels"])
        nll.backward()
        grads.append(model.model.layers[0].mlp.down_proj.weight.grad.clone())
        sums.append((nll.item(), int(hf_loss.target_count(batch)), batch["input_ids"].numel()))
    (a, n_a, cells_a), (b, n_b, cells_b), (c, n_c, cells_c) = sums
    assert n_a == n_b == n_c
    assert cells_c <= cells_b < cells_a  # padding shrinks
    assert abs(a / n_a - b / n_b) < 1e-5 and abs(a / n_a - c / n_c) < 1e-5
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_each_checked_architecture_keeps_examples_in_a_shared_row_apart(hf, kind, tmp_path):
    """The architectures packing and padding-free batches are allowed for: two rows, one
    holding three examples end to end, score their targets as the padded batch does."""
    from stackwise.chat.shared_rows import VERIFIED
    from stackwise.hf import loss as hf_loss
    from stackwise.hf.load import load_base

    assert kind in VERIFIED
    model_dir = tiny_hf(tmp_path / kind, kind=kind)
    cfg = hf_config(model_dir, hf["chat"], tmp_path / "unused", data={"padding_free": True})
    data = chat_data(cfg)
    model = load_base(cfg, torch.device("cpu")).eval()
    by_length = sorted(
        (data.train[i] for i in range(len(data.train))), key=lambda r: len(r["labels"])
    )
    items = [by_length[-1], *by_length[:3]]  # the longest holds room for the short ones
    free = data.train.collate(items)
    assert free["input_ids"].shape[0] < 4  # some examples do share a row
    padded = type(data.train)(items, data.train.pad_id, packed=False).collate(items)
    with torch.no_grad():
        a, _ = hf_loss.target_sums(hf_loss.forward_logits(model, padded), padded["labels"])
        b, _ = hf_loss.target_sums(hf_loss.forward_logits(model, free), free["labels"])
    assert abs(a.item() - b.item()) < 1e-4 * abs(a.item())


def test_shared_rows_are_off_or_refused_where_examples_could_mix(hf, tmp_path):
    """An architecture no test checks, or flash attention: auto pads, asking is refused."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(hf["llama"], other)
    spec = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**spec, "model_type": "bloom"}))
    auto = chat_data(hf_config(other, hf["chat"], tmp_path / "o"))
    assert not auto.train.padding_free and "padding-free" not in auto.describe
    for data, words in (
        ({"padding_free": True}, "'bloom' models are not checked"),
        ({"packing": True}, "'bloom' models are not checked"),
    ):
        with pytest.raises(StackWiseError, match=words):
            chat_data(hf_config(other, hf["chat"], tmp_path / "o", data=data))
    flash = {"model": {"attn_implementation": "flash_attention_2"}}
    assert not chat_data(
        hf_config(hf["llama"], hf["chat"], tmp_path / "f", **flash)
    ).train.padding_free
    with pytest.raises(StackWiseError, match="only in a batch of one row"):
        chat_data(
            hf_config(hf["llama"], hf["chat"], tmp_path / "f", data={"packing": True}, **flash)
        )
    assert "padding-free" in chat_data(hf_config(hf["llama"], hf["chat"], tmp_path / "l")).describe


def test_padding_free_batch_keeps_its_examples():
    """A padding-free batch holds exactly the batch's examples, each whole, in order, with its
    own labels and positions 0..n-1, in rows no longer than its longest example; the padding
    tail is neither a target nor part of an example."""
    from stackwise.chat.data import to_rows

    lengths = (9, 2, 5, 4, 3)
    examples = [
        ([100 * (e + 1) + k for k in range(n)], [-100] + [100 * (e + 1) + k for k in range(1, n)])
        for e, n in enumerate(lengths)
    ]
    rows = to_rows(examples, pad_id=0, packing=False, capacity=64, padding_free=True)
    batch = rows.collate([rows[i] for i in range(len(rows))])
    assert batch["input_ids"].shape == (3, 9) and "attention_mask" not in batch
    found = []
    rows = zip(batch["input_ids"], batch["labels"], batch["position_ids"], strict=True)
    for ids, labels, pos in rows:
        starts = [i for i in range(len(pos)) if pos[i] == 0] + [len(pos)]
        for a, b in itertools.pairwise(starts):
            assert pos[a:b].tolist() == list(range(b - a))
            if ids[a] == 0:  # the padding tail: no target
                assert (labels[a:b] == -100).all()
                continue
            found.append((ids[a:b].tolist(), labels[a:b].tolist()))
    assert sorted(found) == sorted(examples)


def test_resume_restores_adapter_optimizer_and_data_position(hf, tmp_path):
    """Resuming from step 3 of a 6-step run ends exactly where the uninterrupted run ends."""
    cfg = hf_config(
        hf["llama"], hf["chat"], tmp_path / "a", train={"max_steps": 6, "save_steps": 3}
    )
    straight = train_from_config(cfg)
    checkpoint = tmp_path / "a" / "checkpoint-3"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    resumed = train_from_config(
        derive(
            cfg,
            {
                "train.output_dir": str(tmp_path / "b"),
                "train.resume_from_checkpoint": str(checkpoint),
            },
            "test",
        )
    )
    want, got = lora_state(straight.rack), lora_state(resumed.rack)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert resumed.state.history[-1]["loss"] == straight.state.history[-1]["loss"]


@pytest.mark.parametrize("kind", ["qwen2", "untied"])
def test_other_architectures_train(hf, tmp_path, kind):
    res = train_from_config(
        hf_config(hf[kind], hf["chat"], tmp_path / kind, train={"max_steps": 2})
    )
    assert res.state.step == 2 and (tmp_path / kind / "adapter_model.safetensors").is_file()


def test_qlora_quantizes_the_base_and_keeps_its_dtypes(hf, tmp_path, bf16_autocast):
    """NF4 Linear4bit layers under the adapters; norms stay bf16 (no blanket fp32 upcast)."""
    import bitsandbytes as bnb

    cfg = hf_config(
        hf["llama"],
        hf["chat"],
        tmp_path / "q",
        model={"load_in_4bit": True, "dtype": "bf16"},
        train={"max_steps": 2, "mixed_precision": "bf16"},
    )
    res = train_from_config(cfg)
    model = res.rack
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 2 * 7  # q k v o gate up down in each of 2 layers
    assert four_bit[0].weight.quant_state.quant_type == "nf4"
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    assert norms and all(p.dtype == torch.bfloat16 for p in norms)
    lora = [p for n, p in model.named_parameters() if p.requires_grad]
    assert lora and all(p.dtype == torch.float32 for p in lora)
    # B starts at zero: it moved, so gradients flowed through the 4-bit base
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)
    # counted as the values they stand for, not the bytes packing two of them (the header)
    from transformers import AutoModelForCausalLM

    from stackwise.hf.adapter import parameter_size

    assert all(parameter_size(m.weight) == m.in_features * m.out_features for m in four_bit)
    base = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(hf["llama"]).parameters())
    total = sum(parameter_size(p) for p in model.parameters())
    assert total == base + sum(p.numel() for p in lora)


def test_lora_options_reach_peft_and_the_optimizer(hf, tmp_path):
    cfg = hf_config(
        hf["llama"],
        hf["chat"],
        tmp_path / "o",
        lora={
            "enabled": True,
            "use_rslora": True,
            "use_dora": True,
            "target_modules": ["q_proj", "v_proj"],
            "loraplus_lr_ratio": 16.0,
            "modules_to_save": ["lm_head"],
        },
        model={"gradient_checkpointing": True},
        train={"max_steps": 1, "group_lr": {"lora": 1e-3, "base": 1e-4}},
    )
    res = train_from_config(cfg)
    peft_cfg = res.rack.peft_config["default"]
    assert (
        peft_cfg.use_rslora
        and peft_cfg.use_dora
        and set(peft_cfg.target_modules) == {"q_proj", "v_proj"}
    )
    lrs = {g["name"]: g["initial_lr"] for g in res.trainer.optimizer.optimizer.param_groups}
    assert lrs["lora"] == 1e-3 and lrs["lora_B"] == pytest.approx(16e-3) and lrs["base"] == 1e-4
    moved = [p.abs().sum() > 0 for n, p in res.rack.named_parameters() if "lora_B" in n]
    assert res.state.step == 1 and moved and all(moved)  # B starts at zero


def test_hf_keys_on_a_rack_and_bad_combinations_are_refused(hf, tmp_path):
    from stackwise.config import from_dict

    with pytest.raises(StackWiseError, match=r"model\.load_in_4bit only applies to Hugging Face"):
        from_dict({"model": {"load_in_4bit": True}})
    with pytest.raises(StackWiseError, match=r"only LoRA \(or memory\) can train"):
        hf_config(
            hf["llama"],
            hf["chat"],
            tmp_path,
            model={"load_in_4bit": True},
            lora={"enabled": False, "rank": 8, "alpha": 16.0},
        )
    with pytest.raises(StackWiseError, match=r"model\.d_model shapes a StackWise rack"):
        hf_config(hf["llama"], hf["chat"], tmp_path, model={"d_model": 64})
    with pytest.raises(StackWiseError, match="not a local model folder"):
        train_from_config(hf_config(tmp_path / "nowhere", hf["chat"], tmp_path / "r"))


def test_trained_embeddings_stay_tied(hf, tmp_path):
    """modules_to_save: [lm_head] on a tied model trains one matrix that both ends use."""
    cfg = hf_config(hf["llama"], hf["chat"], tmp_path / "t", lora={"modules_to_save": ["lm_head"]})
    res = train_from_config(cfg)
    full = [n for n, p in res.rack.named_parameters() if p.requires_grad and "lora_" not in n]
    assert len(full) == 1 and "embed_tokens" in full[0]
    emb, head = res.rack.get_input_embeddings(), res.rack.get_output_embeddings()
    assert (
        emb.modules_to_save["default"].weight.data_ptr()
        == head.modules_to_save["default"].weight.data_ptr()
    )


def test_gradient_checkpointing_recomputes_and_lora_still_learns(hf, tmp_path):
    from stackwise.hf.adapter import HFAdapter

    for flag, calls_wanted in ((False, 1), (True, 2)):
        cfg = hf_config(
            hf["llama"], hf["chat"], tmp_path / str(flag), model={"gradient_checkpointing": flag}
        )
        model = HFAdapter().build(cfg, 0).train()
        calls: list[int] = []
        mlp = model.get_base_model().model.layers[0].mlp  # inside the checkpointed forward
        mlp.register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        ids = torch.randint(4, 200, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        assert len(calls) == calls_wanted
        grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("init", ["pissa", "olora", "gaussian"])
def test_lora_initializations_train(hf, tmp_path, init):
    """PiSSA and OLoRA move the base's principal part into the adapter (the base changes);
    gaussian leaves the base and draws A from a normal."""
    from safetensors.torch import load_file

    cfg = hf_config(
        hf["llama"],
        hf["chat"],
        tmp_path / init,
        lora={"init_lora_weights": init},
        train={"max_steps": 1},
    )
    res = train_from_config(cfg)
    assert res.rack.peft_config["default"].init_lora_weights == init and res.state.step == 1
    original = load_file(str(hf["llama"] / "model.safetensors"))[
        "model.layers.0.self_attn.q_proj.weight"
    ]
    q = res.rack.get_base_model().model.layers[0].self_attn.q_proj
    assert torch.equal(q.base_layer.weight.float(), original.float()) == (init == "gaussian")


def test_parquet_rows_train(hf, tmp_path):
    import datasets

    rows = [json.loads(x) for x in hf["chat"].read_text().splitlines()]
    path = tmp_path / "chat.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    res = train_from_config(hf_config(hf["llama"], path, tmp_path / "pq", train={"max_steps": 1}))
    assert res.data.chat.examples == len(rows) - 2  # 5% held out, at least one... rounded


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_loftq_is_refused_where_it_cannot_run(hf, tmp_path):
    cfg = hf_config(
        hf["llama"],
        hf["chat"],
        tmp_path / "lq",
        model={"load_in_4bit": True},
        lora={"init_lora_weights": "loftq"},
    )
    with pytest.raises(StackWiseError, match="loftq needs a CUDA GPU"):
        train_from_config(cfg)
